"""Concatenations the NPU does not move (`concat_grids = "shared"`): the tensors a Concat joins take
its grid, the allocator puts each where the Concat's output will hold it, its producer writes it
there, and the Concat emits nothing for it; the simulator still computes the integer model's codes."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper
from test_quantize import SETTINGS  # the settings the other quantize tests use

from conftest import calibration_stats, integer_variants, small_model
from npubuild.targets import npub
from npubuild.targets.compile import compile_npub, plan_partition
from npubuild.targets.hazards import binary_hazards
from npubuild.targets.runtime import Runtime
from npubuild.targets.spec import BUILTIN_TARGETS

RNG = np.random.default_rng(7)


def _model(rng: np.random.Generator) -> onnx.ModelProto:
    """YOLOv8's two concatenations and a third that cannot take all its inputs in place:
    - cat1 (C2f): the two pieces of a Split and a convolution of the second piece;
    - cat2 (SPPF): a tensor and two max pools of it in a chain;
    - cat3: one piece of a Split (whose other piece convolutions read before and after cat3's
      other input is made) and that other input; the Split's tensor cannot move into cat3, as
      its other piece would lie where cat3 holds the other input."""
    weights = {
        "w1": rng.normal(size=(16, 3, 1, 1)) * 0.5,
        "w2": rng.normal(size=(8, 8, 3, 3)) * 0.2,
        "w3": rng.normal(size=(8, 24, 1, 1)) * 0.3,
        "w4": rng.normal(size=(16, 24, 1, 1)) * 0.3,
        "w5": rng.normal(size=(8, 8, 1, 1)) * 2.0,  # f's range is far from d's
        "w6": rng.normal(size=(4, 16, 1, 1)) * 0.3,
        "w7": rng.normal(size=(4, 8, 1, 1)) * 0.3,
        "halves": np.array([8, 8], np.int64),
    }
    pool = {"kernel_shape": [5, 5], "pads": [2, 2, 2, 2], "strides": [1, 1]}
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["t0"], name="conv1"),
        helper.make_node("Relu", ["t0"], ["t"], name="relu1"),
        helper.make_node("Split", ["t", "halves"], ["a", "b"], axis=1, name="split1"),
        helper.make_node("Conv", ["b", "w2"], ["c0"], pads=[1, 1, 1, 1], name="conv2"),
        helper.make_node("Relu", ["c0"], ["c"], name="relu2"),
        helper.make_node("Concat", ["a", "b", "c"], ["cat1"], axis=1, name="cat1"),
        helper.make_node("Conv", ["cat1", "w3"], ["s"], name="conv3"),
        helper.make_node("MaxPool", ["s"], ["s1"], name="pool1", **pool),
        helper.make_node("MaxPool", ["s1"], ["s2"], name="pool2", **pool),
        helper.make_node("Concat", ["s", "s1", "s2"], ["cat2"], axis=1, name="cat2"),
        helper.make_node("Conv", ["cat2", "w4"], ["u"], name="conv4"),
        helper.make_node("Split", ["u", "halves"], ["d", "e"], axis=1, name="split2"),
        helper.make_node("Conv", ["e", "w5"], ["f"], name="conv5"),
        helper.make_node("Concat", ["d", "f"], ["cat3"], axis=1, name="cat3"),
        helper.make_node("Conv", ["cat3", "w6"], ["y0"], name="conv6"),
        helper.make_node("Conv", ["e", "w7"], ["g"], name="conv7"),  # e is still read after f
        helper.make_node("Add", ["y0", "g"], ["y"], name="add"),
    ]
    return small_model(nodes, "concats", {"x": [1, 3, 10, 10]}, {"y": [1, 4, 10, 10]}, weights)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    # the module's model from a seed of its own: which test builds the fixture first varies by worker
    rng = np.random.default_rng(7)
    model = _model(rng)
    samples = rng.normal(size=(8, 3, 10, 10)).astype(np.float32)
    variants = {grids: {**SETTINGS, "concat_grids": grids} for grids in ("shared", "own")}
    out = integer_variants(model, tmp_path_factory.mktemp("concat"), samples, variants)
    return model, out


def _grid(program, name: str) -> tuple:
    t = program.tensors[name]
    return t.scale, t.zero_point, t.bits


def test_the_joined_tensors_take_the_concats_grid(built):
    _, out = built
    shared, _, _ = out["shared"]
    for concat, joined in (("cat1", "t a b c"), ("cat2", "s s1 s2"), ("cat3", "u d e f")):
        assert {_grid(shared, n) for n in [concat, *joined.split()]} == {_grid(shared, concat)}, concat
    own, _, _ = out["own"]
    assert _grid(own, "c") != _grid(own, "cat1") and _grid(own, "u") != _grid(own, "cat3")


@pytest.mark.parametrize("grids", ["shared", "own"])
@pytest.mark.parametrize("target_name", ["vnpu-m", "vnpu-s"])
def test_a_concat_moves_only_what_is_not_already_at_its_place(built, grids, target_name):
    model, out = built
    program, arrays, interpreter = out[grids]
    target = BUILTIN_TARGETS[target_name]
    plan = plan_partition(program, arrays, model, target)
    for group in (True, False):  # grouped (resident tensors) and every tensor through DRAM
        data, _, stats = compile_npub(program, arrays, model, target, plan, group=group)
        # an op with no instructions has no row of its own on the timeline
        moving = {row["node"] for row in stats["layers"] if row["kind"] == "concat"}
        # cat3 copies d, whose Split's tensor cannot move into it; with own grids all three requantize
        assert moving == ({"cat3"} if grids == "shared" else {"cat1", "cat2", "cat3"}), (group, moving)
        # and no instruction overlaps another on the same bytes: a conv's output that ran past its
        # tile buffer (its offset aligned, its schedule's tile size not) lay under the next tile's load
        assert binary_hazards(data) == [], (group, binary_hazards(data))
        runtime = Runtime(npub.read(data))
        for _ in range(2):
            x = RNG.normal(size=(1, 3, 10, 10)).astype(np.float32)
            np.testing.assert_array_equal(runtime.run({"x": x})["y"], interpreter.run({"x": x})[0]["y"])


def test_the_precision_probe_quantizes_the_joined_tensors_on_the_concats_grid(built, tmp_path):
    """The mixed-precision search's probe is the QDQ twin of the integer model: a tensor that
    takes a Concat's grid gets its Q/DQ pair with that grid, as every tensor with a grid of its
    own does (a probe that compared it with the tensor's own range would leave it float)."""
    from npubuild.intmodel.program import parse
    from npubuild.stages.feeds import iterate_feeds
    from npubuild.stages.quantize.integer_model import build_integer_model
    from npubuild.stages.quantize.probe import PrecisionProbe

    model, _ = built
    samples = np.random.default_rng(11).normal(size=(8, 3, 10, 10)).astype(np.float32)
    stats_meta, stats_arrays = calibration_stats(model, tmp_path, samples)
    settings = {**SETTINGS, "concat_grids": "shared"}
    program = parse(build_integer_model(model, stats_meta, stats_arrays, settings)[1], "test")
    probe = PrecisionProbe(model, stats_meta, stats_arrays, settings, list(iterate_feeds(model, samples, 2)))
    bits, _ = probe.plan({})
    made_here = {"t", "c", "s", "u", "f", "cat1", "cat2", "cat3"}  # by a MAC, a fused Relu, a Concat
    assert made_here <= set(bits), made_here - set(bits)
    for name in made_here:
        params, planned = probe._params(name, 8), program.tensors[name]
        assert (params.scale, params.zero_point) == (planned.scale, planned.zero_point), name
