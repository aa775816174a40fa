"""Max pools in stripes (targets/backend/stripes.py): a max pool after a large map (AlexNet's and
ZFNet's first layers, ResNet's stem) runs inside the region's stripes like a convolution, each
stripe reading the rows its windows need (halo rows at the seams, padding only at the map's
edges, what ceil_mode adds written out), so the large map before it never goes to DRAM. The
striped binary computes the integer model's codes."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper
from stripe_kit import SMALL, assert_computes_the_codes, build_int8, striping_of

from conftest import small_model
from npubuild.targets.compile import Grouping, _compile, model_shapes
from npubuild.targets.hazards import binary_hazards

SIZE = 98  # ceil_mode adds a window at the bottom and right edges (49 rows, not 48)
BUDGET = 64 * 1024


def _model(rng: np.random.Generator) -> onnx.ModelProto:
    """A stem as the classic CNNs have it: a convolution, a 3x3 stride-2 max pool with ceil_mode,
    a 3x3 convolution, a padded 2x2 max pool; and a second stem whose pool has pads on top and
    left only."""
    weights = {
        "w0": rng.normal(size=(16, 3, 3, 3)) * 0.4,
        "w1": rng.normal(size=(16, 16, 3, 3)) * 0.1,
        "w2": rng.normal(size=(16, 3, 3, 3)) * 0.4,
    }
    nodes = [
        helper.make_node("Conv", ["x", "w0"], ["a0"], pads=[1, 1, 1, 1], name="conv_a"),
        helper.make_node("Relu", ["a0"], ["a1"], name="relu_a"),
        helper.make_node(
            "MaxPool", ["a1"], ["a2"], kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1, name="pool_a"
        ),
        helper.make_node("Conv", ["a2", "w1"], ["a3"], pads=[1, 1, 1, 1], name="conv_a2"),
        helper.make_node(
            "MaxPool", ["a3"], ["y1"], kernel_shape=[2, 2], strides=[2, 2], pads=[1, 1, 1, 1], name="pool_a2"
        ),
        helper.make_node("Conv", ["x", "w2"], ["b0"], pads=[1, 1, 1, 1], strides=[1, 1], name="conv_b"),
        helper.make_node(
            "MaxPool", ["b0"], ["y2"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 0, 0], name="pool_b"
        ),
    ]
    return small_model(
        nodes, "pools", {"x": [1, 3, SIZE, SIZE]}, {"y1": [1, 16, 25, 25], "y2": [1, 16, 49, 49]}, weights
    )


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    rng = np.random.default_rng(6)
    model = _model(rng)
    samples = rng.normal(size=(6, 3, SIZE, SIZE)).astype(np.float32)
    return build_int8(model, tmp_path_factory.mktemp("pools"), samples)


def _striping(built):
    return striping_of(built, BUDGET, to_the_end=True)


def _compile_striped(built, striping) -> tuple[bytes, dict]:
    """The binary with `striping` (None: no stripes) at the test's budget, checked hazard-free and
    against the integer model's codes."""
    model, program, arrays, _, plan = built
    grouping = Grouping(BUDGET, 0.125, striping)
    data, stats = _compile(program, arrays, model, SMALL, plan, True, True, grouping)
    assert binary_hazards(data) == []
    assert_computes_the_codes(data, built)
    return data, stats


def test_the_pools_run_inside_the_stripes(built):
    model, *_ = built
    striping = _striping(built)
    regions = sorted(c["layers"] for c in striping.chains)
    assert ["conv_a", "pool_a", "conv_a2", "pool_a2"] in regions
    assert ["conv_b", "pool_b"] in regions
    # no map before a pool leaves the stripes whole: each pool reads a stripe's rows
    pools = [op for op in striping.program.ops if op.op_type == "MaxPool"]
    assert len(pools) > 3 and all(op.inputs[0] in striping.intermediates for op in pools)
    # the stripes of each pool cover its output exactly, seams meeting
    shapes = model_shapes(model)
    for y in ("y1", "y2"):
        spans = sorted(striping.rows[op.outputs[0]] for op in pools if op.outputs[0].startswith(f"{y}@"))
        assert spans[0][0] == 0 and spans[-1][1] == shapes[y][2] and len(spans) > 1
        assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
    # padding only where a stripe meets the map's edge; ceil_mode written out
    for op in pools:
        lo, hi = striping.rows[op.outputs[0]]
        top, _, bottom, _ = op.attrs["pads"]
        assert op.attrs["ceil_mode"] == 0
        assert lo == 0 or top == 0
        assert hi == shapes[op.outputs[0].split("@")[0]][2] or bottom == 0


def test_the_striped_pools_compute_the_codes_and_move_fewer_bytes(built):
    striped = _compile_striped(built, _striping(built))[1]
    whole = _compile_striped(built, None)[1]
    assert striped["dram_bytes"] < whole["dram_bytes"]


def _widening_diamond(rng: np.random.Generator) -> onnx.ModelProto:
    """x read by a 1x1 convolution and a ReLU; the ReLU's branch then runs a 3x3 convolution
    before the Add joins the two: both readers of `a` keep rows, but the branch needs rows of `a`
    around the stripe's after its last reader, so one stripe would need two spans of `a`."""
    weights = {
        "w0": rng.normal(size=(16, 3, 3, 3)) * 0.4,
        "w1": rng.normal(size=(16, 16, 1, 1)) * 0.2,
        "w2": rng.normal(size=(16, 16, 3, 3)) * 0.1,
    }
    nodes = [
        helper.make_node("Conv", ["x", "w0"], ["a"], pads=[1, 1, 1, 1], name="conv_a"),
        helper.make_node("Conv", ["a", "w1"], ["b"], name="pointwise"),
        helper.make_node("Relu", ["a"], ["c"], name="relu"),
        helper.make_node("Conv", ["c", "w2"], ["d"], pads=[1, 1, 1, 1], name="widening"),
        helper.make_node("Add", ["b", "d"], ["y"], name="join"),
    ]
    return small_model(nodes, "widening", {"x": [1, 3, SIZE, SIZE]}, {"y": [1, 16, SIZE, SIZE]}, weights)


def test_a_branch_that_widens_before_its_join_is_no_region(tmp_path):
    rng = np.random.default_rng(7)
    model = _widening_diamond(rng)
    built = build_int8(model, tmp_path, rng.normal(size=(4, 3, SIZE, SIZE)).astype(np.float32))
    striping = _striping(built)
    regions = [c["layers"] for c in striping.chains] if striping is not None else []
    # no region holds both readers of `a` (a join may still take `d` as a second entry)
    assert not any({"pointwise", "widening"} <= set(r) for r in regions), regions
    assert len({name for r in regions for name in r}) == sum(len(r) for r in regions)  # disjoint
    if striping is not None:  # what is striped still computes the codes
        _compile_striped(built, striping)


def test_a_constant_first_operand_is_traced_as_an_element_wise_op(tmp_path):
    """A Mul whose first input is a scalar constant (as exporters write `2 * x`): a region traces
    it as keeping rows, without reading the constant's shape as a map's (an IndexError on the
    example's det with its precision table at goal 0.999, 2026-11-28)."""
    rng = np.random.default_rng(8)
    weights = {
        "w0": rng.normal(size=(16, 3, 3, 3)) * 0.4,
        "k": np.array(1.7),
        "w1": rng.normal(size=(16, 16, 3, 3)) * 0.1,
    }
    nodes = [
        helper.make_node("Conv", ["x", "w0"], ["a"], pads=[1, 1, 1, 1], name="conv_a"),
        helper.make_node("Mul", ["k", "a"], ["b"], name="scaled"),
        helper.make_node("Conv", ["b", "w1"], ["y"], pads=[1, 1, 1, 1], name="conv_b"),
    ]
    model = small_model(nodes, "scaled", {"x": [1, 3, SIZE, SIZE]}, {"y": [1, 16, SIZE, SIZE]}, weights)
    built = build_int8(model, tmp_path, rng.normal(size=(4, 3, SIZE, SIZE)).astype(np.float32))
    assert any(op.node == "scaled" and op.inputs[0] in op.constants for op in built.program.ops)
    striping = _striping(built)
    assert striping is not None and ["conv_a", "scaled", "conv_b"] in [c["layers"] for c in striping.chains]
    _compile_striped(built, striping)
