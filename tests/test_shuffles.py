"""Channel shuffles read through (backend/shuffles.py): ShuffleNet's Reshape -> Transpose ->
Reshape moves nothing when its readers are convolutions loading whole runs of g channels; each
reads the input's channels permuted by a strided box. The simulator computes the integer model's
codes with and without grouping, the stream keeps its waits, and a shuffle that something else
reads (here an Add) stays a copy."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper
from test_quantize import SETTINGS

from conftest import integer_variants, npu_instructions, small_model
from npubuild.targets import npub
from npubuild.targets.compile import compile_npub, plan_partition
from npubuild.targets.hazards import binary_hazards
from npubuild.targets.runtime import Runtime
from npubuild.targets.spec import BUILTIN_TARGETS

G, PER = 4, 6  # 4 groups of 6 channels: 24


def _model(rng: np.random.Generator, added: bool):
    """A grouped 1 x 1 conv, the shuffle, then a depthwise 3 x 3 conv and a 1 x 1 conv; with
    `added`, the shuffled map is also added to the depthwise conv's result."""
    c = G * PER
    weights = {
        "w1": rng.normal(size=(c, 8 // G, 1, 1)) * 0.5,
        "w2": rng.normal(size=(c, 1, 3, 3)) * 0.4,
        "w3": rng.normal(size=(16, c, 1, 1)) * 0.3,
        "split": np.array([1, G, PER, 100], np.int64),
        "back": np.array([1, c, 10, 10], np.int64),
    }
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], group=G, name="grouped"),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu"),
        helper.make_node("Reshape", ["r1", "split"], ["s1"], name="split"),
        helper.make_node("Transpose", ["s1"], ["t"], perm=[0, 2, 1, 3], name="shuffle"),
        helper.make_node("Reshape", ["t", "back"], ["u"], name="back"),
        helper.make_node("Conv", ["u", "w2"], ["d"], pads=[1, 1, 1, 1], group=c, name="depthwise"),
    ]
    if added:
        nodes.append(helper.make_node("Add", ["d", "u"], ["e"], name="add"))
    nodes.append(helper.make_node("Conv", ["e" if added else "d", "w3"], ["y"], name="project"))
    return small_model(nodes, "shuffle", {"x": [1, 8, 10, 10]}, {"y": [1, 16, 10, 10]}, weights)


@pytest.fixture(scope="module", params=[False, True], ids=["read-through", "also-added"])
def built(request, tmp_path_factory):
    rng = np.random.default_rng(31)
    model = _model(rng, request.param)
    samples = rng.normal(size=(6, 8, 10, 10)).astype(np.float32)
    program, arrays, interpreter = integer_variants(
        model, tmp_path_factory.mktemp("shuffle"), samples, {"default": SETTINGS}
    )["default"]
    return request.param, model, program, arrays, interpreter


@pytest.mark.parametrize("target_name", ["vnpu-m", "vnpu-s"])
def test_a_shuffle_read_through_computes_the_integer_models_codes(built, target_name):
    added, model, program, arrays, interpreter = built
    target = BUILTIN_TARGETS[target_name]
    plan = plan_partition(program, arrays, model, target)
    rng = np.random.default_rng(7)
    feeds = [{"x": rng.normal(size=(1, 8, 10, 10)).astype(np.float32)} for _ in range(2)]
    for group in (True, False):
        data, _, stats = compile_npub(program, arrays, model, target, plan, group=group)
        assert binary_hazards(data) == []
        kinds = [row["kind"] for row in stats["layers"]]
        assert kinds.count("move") == (1 if added else 0), kinds  # the Transpose's copy
        binary = npub.read(data)
        loads = [
            i.args
            for i in npu_instructions(binary)
            if i.op == "load" and i.args["d1"] == G and i.args["s1"] == PER * 100
        ]
        # the depthwise conv's input: runs of G channels, channel b of a run PER channels apart
        assert bool(loads) != added, loads
        runtime = Runtime(binary)
        for feed in feeds:
            np.testing.assert_array_equal(runtime.run(feed)["y"], interpreter.run(feed)[0]["y"])
