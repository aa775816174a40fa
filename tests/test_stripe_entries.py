"""Regions with two entries (targets/backend/stripes.py): a join whose second operand is made
outside the region (a residual's shortcut, a feature pyramid's upsampled level) reads that map
through a Slice per stripe, as the first entry; and the nearest upsample that makes it joins the
region, so the stripes read the smaller map and upsample their own rows: a stripe then holds
whole repeats of the upsampled rows, and the 3x3 convolution after the join crops the extra
ones. The striped binary computes the integer model's codes and moves fewer DRAM bytes."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper
from stripe_kit import SMALL, assert_computes_the_codes, build_int8, squeeze_excite_tail, striping_of

from conftest import small_model
from npubuild.targets.backend.stripe_rows import traced
from npubuild.targets.compile import Grouping, _compile, model_shapes
from npubuild.targets.hazards import binary_hazards

SIZE = 96
BUDGET = 64 * 1024


def _pyramid(rng: np.random.Generator, mode: str) -> onnx.ModelProto:
    """A feature pyramid's top-down join: a fine map (a convolution of the input, a squeeze-excite
    tail on it as PP-OCR det's FPN has) plus the coarse level (a stride-2 convolution) upsampled
    2x, then a 3x3 convolution; and a residual join whose shortcut is read by two regions' worth of
    ops."""
    weights = {
        "w0": rng.normal(size=(16, 3, 3, 3)) * 0.4,
        "w1": rng.normal(size=(16, 3, 3, 3)) * 0.4,
        "wse": rng.normal(size=(16, 16, 1, 1)) * 0.3,
        "w2": rng.normal(size=(8, 16, 3, 3)) * 0.1,
        "scales": np.array([1.0, 1.0, 2.0, 2.0]),
    }
    nodes = [
        helper.make_node("Conv", ["x", "w0"], ["fine"], pads=[1, 1, 1, 1], name="fine_conv"),
        *squeeze_excite_tail("fine", "lateral"),
        helper.make_node(
            "Conv", ["x", "w1"], ["coarse"], pads=[1, 1, 1, 1], strides=[2, 2], name="coarse_conv"
        ),
        helper.make_node(
            "Resize",
            ["coarse", "", "scales"],
            ["up"],
            mode="nearest",
            coordinate_transformation_mode=mode,
            name="upsample",
        ),
        helper.make_node("Add", ["lateral", "up"], ["merged"], name="merge"),
        helper.make_node("Conv", ["merged", "w2"], ["y"], pads=[1, 1, 1, 1], name="smooth"),
    ]
    return small_model(nodes, "pyramid", {"x": [1, 3, SIZE, SIZE]}, {"y": [1, 8, SIZE, SIZE]}, weights, 13)


@pytest.fixture(scope="module", params=["asymmetric", "half_pixel"])
def built(request, tmp_path_factory):
    rng = np.random.default_rng(11)
    model = _pyramid(rng, request.param)
    samples = rng.normal(size=(6, 3, SIZE, SIZE)).astype(np.float32)
    return build_int8(model, tmp_path_factory.mktemp("pyramid"), samples)


def _layers(striping) -> list[list[str]]:
    return sorted(c["layers"] for c in striping.chains) if striping is not None else []


def test_the_upsample_and_both_joins_are_one_region(built):
    striping = striping_of(built, BUDGET, joins=True)
    assert ["gated", "lateral", "upsample", "merge", "smooth"] in _layers(striping)
    # the stripes read rows of the coarse map, never the upsampled one whole or sliced
    ops = striping.program.ops
    assert not any(op.outputs == ["up"] for op in ops)
    slices = [op for op in ops if op.kind == "move" and op.inputs[0] == "coarse"]
    assert slices and all(striping.rows[op.outputs[0]][1] <= SIZE // 2 for op in slices)


def test_a_stripe_holds_whole_repeats_of_the_upsampled_rows(built):
    striping = striping_of(built, BUDGET, joins=True)
    ops = striping.program.ops
    ups = [op for op in ops if op.kind == "resize_nearest"]
    assert len(ups) > 1
    for op in ups:
        lo, hi = striping.rows[op.outputs[0]]
        a, b = striping.rows[op.inputs[0]]
        assert lo % 2 == 0 and hi % 2 == 0 and (lo, hi) == (2 * a, 2 * b), op
        assert op.attrs.out_shape[2] == hi - lo
    # the smoothing convolution's stripes cover the output exactly, cropping what they do not need
    smooth = sorted(striping.rows[op.outputs[0]] for op in ops if op.node == "smooth" and op.kind == "conv")
    assert (
        smooth[0][0] == 0 and smooth[-1][1] == SIZE and all(a[1] == b[0] for a, b in zip(smooth, smooth[1:]))
    )
    assert any(
        op.attrs.pads[0] < 0 or op.attrs.pads[2] < 0
        for op in ops
        if op.node == "smooth" and op.kind == "conv"
    )


def test_rows_traced_through_an_upsample_are_whole_repeats(built):
    model, program, arrays, *_ = built
    shapes = model_shapes(model)
    names = ["gated", "lateral", "upsample", "merge", "smooth"]
    region = [next(op for op in program.ops if op.node == n and op.kind != "quantize") for n in names]
    for lo, hi in ((0, 1), (5, 6), (33, 64), (95, 96)):
        need, borders = traced(region, shapes, arrays, lo, hi)
        a, b = need["merged"]
        assert a % 2 == 0 and b % 2 == 0 and a <= max(lo - 1, 0) and b >= min(hi + 1, SIZE)
        assert need["coarse"] == (a // 2, b // 2) and need["fine"] == (a, b)
        top, bottom = borders[len(region) - 1]
        # the window's first and last rows (padding counted) are where they were: the padding
        # shrinks (below zero, a crop) by the extra rows the stripe holds
        assert a - top == lo - 1 and b + bottom == hi + 1


def test_the_striped_pyramid_computes_the_codes_and_moves_fewer_bytes(built):
    model, program, arrays, _, plan = built
    striping = striping_of(built, BUDGET, joins=True)
    striped = _compile(program, arrays, model, SMALL, plan, True, True, Grouping(BUDGET, 0.125, striping))
    whole = _compile(program, arrays, model, SMALL, plan, True, True, Grouping(BUDGET, 0.125, None))
    assert binary_hazards(striped[0]) == []
    assert_computes_the_codes(striped[0], built)
    assert striped[1]["dram_bytes"] < whole[1]["dram_bytes"]


def _join_then(rng: np.random.Generator, factor: int, kernel: int, stride: int) -> onnx.ModelProto:
    """A map plus a coarser one upsampled by `factor`, then a `kernel` x `kernel` convolution of
    `stride` (padded to keep the map's size at stride 1)."""
    weights = {
        "w0": rng.normal(size=(8, 3, 3, 3)) * 0.4,
        "w1": rng.normal(size=(8, 3, 3, 3)) * 0.4,
        "w2": rng.normal(size=(8, 8, kernel, kernel)) * 0.1,
        "scales": np.array([1.0, 1.0, float(factor), float(factor)]),
    }
    pad = kernel // 2
    nodes = [
        helper.make_node("Conv", ["x", "w0"], ["fine"], pads=[1, 1, 1, 1], name="fine_conv"),
        helper.make_node(
            "Conv", ["x", "w1"], ["coarse"], pads=[1, 1, 1, 1], strides=[factor, factor], name="coarse"
        ),
        helper.make_node("Resize", ["coarse", "", "scales"], ["up"], mode="nearest", name="upsample"),
        helper.make_node("Add", ["fine", "up"], ["merged"], name="merge"),
        helper.make_node("Relu", ["merged"], ["act"], name="act"),
        helper.make_node(
            "Conv", ["act", "w2"], ["y"], pads=[pad] * 4, strides=[stride, stride], name="after"
        ),
    ]
    out = SIZE // stride
    return small_model(nodes, "join", {"x": [1, 3, SIZE, SIZE]}, {"y": [1, 8, out, out]}, weights, 13)


@pytest.mark.parametrize("factor, kernel, stride", [(4, 3, 1), (2, 5, 1), (2, 3, 2), (4, 1, 1)])
def test_joins_of_upsampled_maps_compute_the_codes(tmp_path, factor, kernel, stride):
    """Whole repeats of 4 rows, a 5x5 window, a stride-2 convolution and a 1x1 one after the join:
    each striped binary computes the integer model's codes."""
    rng = np.random.default_rng(factor * 100 + kernel * 10 + stride)
    model = _join_then(rng, factor, kernel, stride)
    built = build_int8(model, tmp_path, rng.normal(size=(4, 3, SIZE, SIZE)).astype(np.float32))
    striping = striping_of(built, BUDGET // 2, joins=True)
    # the upsample, the join and the convolution after it in one region
    assert any({"upsample", "merge", "after"} <= set(layers) for layers in _layers(striping)), _layers(
        striping
    )
    for op in striping.program.ops:
        if op.kind == "resize_nearest":
            lo, hi = striping.rows[op.outputs[0]]
            assert lo % factor == 0 and hi % factor == 0
    data = _compile(
        built.program,
        built.arrays,
        model,
        SMALL,
        built.plan,
        True,
        True,
        Grouping(BUDGET // 2, 0.125, striping),
    )[0]
    assert binary_hazards(data) == []
    assert_computes_the_codes(data, built)
