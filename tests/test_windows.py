"""Windows read through (backend/windows.py): a Slice of rows or columns of a map, which is not a
contiguous piece of it, moves nothing where its readers load boxes (a Mul by a per-channel
constant, a lookup table, a convolution): each reads the window as a strided box of the map. The
simulator computes the integer model's codes with and without grouping on both targets, the
stream keeps its waits, and a window something else reads (here: a network output) stays a copy."""

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

C, H, W = 8, 12, 10


def _model(rng: np.random.Generator, exposed: bool):
    """A 3x3 conv and ReLU make r; rows 3..9 of r times a per-channel gain (y1), rows 2..12 into a
    3x3 conv (y2), columns 1..7 through a sigmoid's table, times the gain (y3), columns 2..8 of
    rows 2..10 times the gain (y4); with `exposed`, rows 3..9 are a network output too."""
    weights = {
        "w1": rng.normal(size=(C, 4, 3, 3)) * 0.4,
        "w2": rng.normal(size=(4, C, 3, 3)) * 0.3,
        "k": rng.uniform(0.5, 1.5, size=(1, C, 1, 1)),
        "b": rng.normal(size=(1, C, 1, 1)) * 0.2,
    }
    cuts = {"r1": (3, 9, 2), "r2": (2, 12, 2), "c3": (1, 7, 3), "r4": (2, 10, 2), "c4": (2, 8, 3)}
    for name, (start, end, axis) in cuts.items():
        weights[f"{name}_s"] = np.array([start], np.int64)
        weights[f"{name}_e"] = np.array([end], np.int64)
        weights[f"{name}_a"] = np.array([axis], np.int64)
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c"], pads=[1, 1, 1, 1], name="conv"),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        *(
            helper.make_node("Slice", ["r", f"{n}_s", f"{n}_e", f"{n}_a"], [f"s_{n}"], name=f"slice_{n}")
            for n in ("r1", "r2", "c3")
        ),
        helper.make_node("Mul", ["s_r1", "k"], ["m"], name="gain"),
        helper.make_node("Add", ["m", "b"], ["y1"], name="shift"),
        helper.make_node("Conv", ["s_r2", "w2"], ["y2"], name="conv2"),
        helper.make_node("Sigmoid", ["s_c3"], ["g"], name="sigmoid"),
        helper.make_node("Mul", ["g", "k"], ["y3"], name="gain3"),
        # a window of a window: rows 2..10 of r, then columns 2..8 of those
        helper.make_node("Slice", ["r", "r4_s", "r4_e", "r4_a"], ["s_r4"], name="slice_r4"),
        helper.make_node("Slice", ["s_r4", "c4_s", "c4_e", "c4_a"], ["s_c4"], name="slice_c4"),
        helper.make_node("Mul", ["s_c4", "k"], ["y4"], name="gain4"),
    ]
    outputs = {"y1": [1, C, 6, W], "y2": [1, 4, 8, 8], "y3": [1, C, H, 6], "y4": [1, C, 8, 6]}
    if exposed:
        outputs["s_r1"] = [1, C, 6, W]
    return small_model(nodes, "windows", {"x": [1, 4, H, W]}, outputs, weights)


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict:
    """exposed -> (model, program, arrays, interpreter)."""
    out = {}
    for exposed in (False, True):
        rng = np.random.default_rng(41)
        model = _model(rng, exposed)
        samples = rng.normal(size=(6, 4, H, W)).astype(np.float32)
        variants = integer_variants(model, tmp_path_factory.mktemp("windows"), samples, {"int8": SETTINGS})
        out[exposed] = (model, *variants["int8"])
    return out


@pytest.mark.parametrize("exposed", [False, True], ids=["read-through", "exposed"])
@pytest.mark.parametrize("target_name", ["vnpu-m", "vnpu-s"])
def test_a_window_read_through_computes_the_integer_models_codes(built, exposed, target_name):
    model, program, arrays, interpreter = built[exposed]
    target = BUILTIN_TARGETS[target_name]
    plan = plan_partition(program, arrays, model, target)
    npu_ops = [len(sg["ops"]) for sg in plan["subgraphs"] if sg["device"] == "npu"]
    assert npu_ops == [len(program.ops) - 1]  # all but the input's conversion
    rng = np.random.default_rng(8)
    feeds = [{"x": rng.normal(size=(1, 4, H, W)).astype(np.float32)} for _ in range(2)]
    names = [o.name for o in model.graph.output]
    for group in (True, False):
        data, _, stats = compile_npub(program, arrays, model, target, plan, group=group)
        assert binary_hazards(data) == []
        kinds = [row["kind"] for row in stats["layers"]]
        assert kinds.count("move") == (1 if exposed else 0), kinds  # the exposed Slice's copy
        binary = npub.read(data)
        loads = [i.args for i in npu_instructions(binary) if i.op == "load"]
        # boxes of fewer rows or columns than r, with r's strides: the gain's rows (exposed: the
        # copy's), the table's columns, and the window of a window's rows and columns
        strided = {(a["d2"], a["d3"]) for a in loads if a["s1"] == H * W and a["s2"] == W}
        assert {(6, W), (H, 6), (8, 6)} <= strided, strided
        # exposed, the gain reads the copy where it lies; read through, no copy has an address
        copy = binary.meta["tensors"].get("s_r1")
        assert (copy is not None) == exposed
        assert not exposed or any(a["space"] == 0 and a["dram"] == copy["dram"] for a in loads)
        runtime = Runtime(binary)
        runtime = Runtime(binary)
        for feed in feeds:
            got, want = runtime.run(feed), interpreter.run(feed)[0]
            for name in names:
                np.testing.assert_array_equal(got[name], want[name], err_msg=name)
