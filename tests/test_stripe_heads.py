"""A feature pyramid's two last DRAM round trips (docs/npu.md, "A pyramid's head and its
squeeze-excite maps in stripes"): the head that concatenates the levels, each upsampled to the
finest, and convolves the result; and a squeeze-excite block on a map a pointwise convolution
widens, whose pool needed the whole wide map before its gate could multiply it. A channel
concatenation is a region op (rows of its result are the same rows of each input), so the head's
stripes upsample their rows of each level and never make the concatenated map whole; optimize's
`pools_before_widening_convs` pools the narrow map instead, and a region may read a gate made
after its first op from other maps, so the widening convolution and its tail run in stripes."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper
from stripe_kit import SMALL, assert_computes_the_codes, build_int8, squeeze_excite_tail, striping_of

from conftest import small_model
from npubuild.stages.optimize.stage import optimize
from npubuild.targets.compile import Grouping, _compile
from npubuild.targets.hazards import binary_hazards

SIZE = 96
BUDGET = 64 * 1024
# the head's stripes hold the concatenated map's rows too: at BUDGET its 16 stripes' maps do not
# all stay resident (the grouping search compiles several budgets and stripe counts)
HEAD_BUDGET = 2 * BUDGET


def _head(rng: np.random.Generator) -> onnx.ModelProto:
    """Three levels of a pyramid (96, 48 and 24 rows), the coarse two upsampled to the finest,
    concatenated along channels and convolved 3x3: PP-OCR det's head, small."""
    weights = {
        "w0": rng.normal(size=(8, 3, 3, 3)) * 0.4,
        "w1": rng.normal(size=(8, 3, 3, 3)) * 0.4,
        "w2": rng.normal(size=(8, 3, 3, 3)) * 0.4,
        "w3": rng.normal(size=(8, 24, 3, 3)) * 0.1,
        "two": np.array([1.0, 1.0, 2.0, 2.0]),
        "four": np.array([1.0, 1.0, 4.0, 4.0]),
    }
    nodes = [
        helper.make_node("Conv", ["x", "w0"], ["fine"], pads=[1, 1, 1, 1], name="fine"),
        helper.make_node("Conv", ["x", "w1"], ["mid"], pads=[1, 1, 1, 1], strides=[2, 2], name="mid"),
        helper.make_node("Conv", ["x", "w2"], ["coarse"], pads=[1, 1, 1, 1], strides=[4, 4], name="coarse"),
        helper.make_node("Resize", ["coarse", "", "four"], ["up4"], mode="nearest", name="up4"),
        helper.make_node("Resize", ["mid", "", "two"], ["up2"], mode="nearest", name="up2"),
        helper.make_node("Concat", ["up4", "up2", "fine"], ["fused"], axis=1, name="concat"),
        helper.make_node("Conv", ["fused", "w3"], ["y"], pads=[1, 1, 1, 1], name="head"),
    ]
    return small_model(nodes, "head", {"x": [1, 3, SIZE, SIZE]}, {"y": [1, 8, SIZE, SIZE]}, weights, 13)


def _layers(striping) -> list[list[str]]:
    return sorted(c["layers"] for c in striping.chains) if striping is not None else []


@pytest.fixture(scope="module")
def head(tmp_path_factory):
    rng = np.random.default_rng(3)
    samples = rng.normal(size=(4, 3, SIZE, SIZE)).astype(np.float32)
    return build_int8(_head(rng), tmp_path_factory.mktemp("head"), samples)


def test_the_head_upsamples_concatenates_and_convolves_in_one_region(head):
    striping = striping_of(head, HEAD_BUDGET, joins=True)
    assert any({"up4", "up2", "concat", "head"} <= set(layers) for layers in _layers(striping)), _layers(
        striping
    )
    ops = striping.program.ops
    # the concatenated map and the upsampled levels are never made whole: the stripes read rows of
    # the coarse maps (whole repeats of 4 rows, the coarsest's factor) and of the fine one
    assert not any(op.outputs[0] in ("fused", "up2", "up4") for op in ops)
    for op in ops:
        if op.kind == "resize_nearest":
            lo, hi = striping.rows[op.outputs[0]]
            assert lo % 4 == 0 and (hi % 4 == 0 or hi == SIZE), (op.outputs, lo, hi)


def test_the_striped_head_computes_the_codes_and_moves_fewer_bytes(head):
    model, program, arrays, _, plan = head
    striping = striping_of(head, HEAD_BUDGET, joins=True)
    striped = _compile(
        program, arrays, model, SMALL, plan, True, True, Grouping(HEAD_BUDGET, 0.125, striping)
    )
    whole = _compile(program, arrays, model, SMALL, plan, True, True, Grouping(HEAD_BUDGET, 0.125, None))
    assert binary_hazards(striped[0]) == []
    assert_computes_the_codes(striped[0], head)
    # at least the concatenated map's store and load fewer (8 x 3 x 96 x 96 bytes each way)
    assert striped[1]["dram_bytes"] <= whole[1]["dram_bytes"] - 2 * 24 * SIZE * SIZE


def _widened(rng: np.random.Generator, wide: int) -> onnx.ModelProto:
    """A narrow map (4 channels) a pointwise convolution takes to `wide` channels, a squeeze-excite
    tail on the result, then a 3x3 convolution: one level of PP-OCR det's feature pyramid."""
    weights = {
        "w0": rng.normal(size=(4, 3, 3, 3)) * 0.4,
        "w1": rng.normal(size=(wide, 4, 1, 1)) * 0.5,
        "b1": rng.normal(size=(wide,)) * 0.1,
        "wse": rng.normal(size=(wide, wide, 1, 1)) * 0.3,
        "w2": rng.normal(size=(8, wide, 3, 3)) * 0.1,
    }
    nodes = [
        helper.make_node("Conv", ["x", "w0"], ["narrow"], pads=[1, 1, 1, 1], name="narrow"),
        helper.make_node("Conv", ["narrow", "w1", "b1"], ["wide"], name="widen"),
        *squeeze_excite_tail("wide", "tail"),
        helper.make_node("Conv", ["tail", "w2"], ["y"], pads=[1, 1, 1, 1], name="smooth"),
    ]
    return small_model(nodes, "widened", {"x": [1, 3, SIZE, SIZE]}, {"y": [1, 8, SIZE, SIZE]}, weights, 13)


def _pool_input(model: onnx.ModelProto) -> str:
    (pool,) = [n for n in model.graph.node if n.op_type == "GlobalAveragePool"]
    return pool.input[0]


def test_a_pool_of_a_widening_pointwise_convolution_pools_its_input_and_computes_the_same():
    rng = np.random.default_rng(7)
    model = _widened(rng, 16)
    optimized, log = optimize(model, [], 8)
    assert _pool_input(optimized) == "narrow"
    assert any("pools_before_widening_convs" in it["changes"] for it in log)
    x = rng.normal(size=(1, 3, SIZE, SIZE)).astype(np.float32)
    before = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    after = ort.InferenceSession(optimized.SerializeToString()).run(None, {"x": x})[0]
    np.testing.assert_allclose(after, before, rtol=1e-4, atol=1e-4)


def test_a_pool_of_a_narrowing_convolution_stays():
    """Pooling the wider input would read more bytes, not fewer."""
    optimized, _ = optimize(_widened(np.random.default_rng(7), 2), [], 8)
    assert _pool_input(optimized) != "narrow"


@pytest.fixture(scope="module")
def widened(tmp_path_factory):
    rng = np.random.default_rng(5)
    model, _ = optimize(_widened(rng, 16), [], 8)
    samples = rng.normal(size=(4, 3, SIZE, SIZE)).astype(np.float32)
    return build_int8(model, tmp_path_factory.mktemp("widened"), samples)


def test_the_widening_convolution_and_its_tail_run_in_stripes(widened):
    model, program, arrays, _, plan = widened
    striping = striping_of(widened, BUDGET, joins=True)
    assert any({"widen", "gated", "tail", "smooth"} <= set(layers) for layers in _layers(striping)), _layers(
        striping
    )
    assert not any(op.outputs[0] == "wide" for op in striping.program.ops)  # never made whole
    striped = _compile(program, arrays, model, SMALL, plan, True, True, Grouping(BUDGET, 0.125, striping))
    whole = _compile(program, arrays, model, SMALL, plan, True, True, Grouping(BUDGET, 0.125, None))
    assert binary_hazards(striped[0]) == []
    assert_computes_the_codes(striped[0], widened)
    # the wide map (16 x 96 x 96 bytes) no longer goes to DRAM and back
    assert striped[1]["dram_bytes"] <= whole[1]["dram_bytes"] - 2 * 16 * SIZE * SIZE
