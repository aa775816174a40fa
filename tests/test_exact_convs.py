"""onnxruntime's float32 convolutions as an exact integer engine (intmodel/ortconv.py): equal to
numpy's float64 sums of the same integer products on every geometry the integer model has, and
refused (None) when a partial sum could leave float32's exact integers."""

from __future__ import annotations

import numpy as np
import pytest

from npubuild.intmodel.kernels import conv_sums, conv_transpose_accumulate
from npubuild.intmodel.ortconv import FLOAT32_EXACT, ExactConvs, channel_l1
from npubuild.intmodel.program import ConvGeometry

GEOMETRIES = [
    # (input shape, weight shape, geometry)
    ((1, 8, 13, 11), (16, 8, 3, 3), dict(strides=[1, 1], pads=[1, 1, 1, 1])),
    ((2, 8, 13, 11), (16, 8, 3, 3), dict(strides=[2, 2], pads=[1, 0, 1, 0])),
    ((1, 12, 9, 9), (12, 1, 3, 3), dict(strides=[1, 1], pads=[1, 1, 1, 1], group=12)),  # depthwise
    ((1, 6, 9, 9), (12, 1, 5, 5), dict(strides=[2, 2], pads=[2, 2, 2, 2], group=6)),  # multiplier 2
    ((1, 8, 10, 10), (8, 2, 3, 3), dict(strides=[1, 1], pads=[2, 2, 2, 2], dilations=[2, 2], group=4)),
    ((1, 16, 7, 7), (32, 16, 1, 1), dict(strides=[1, 1], pads=[0, 0, 0, 0])),
    ((1, 4, 20), (6, 4, 3), dict(strides=[1], pads=[1, 1], dilations=[1])),  # 1-D
    ((1, 8, 12, 12), (8, 8, 3, 3), dict(strides=[1, 1], auto_pad="SAME_UPPER", pads=[0, 0, 0, 0])),
]


def _geometry(weight_shape, fields: dict) -> ConvGeometry:
    nd = len(weight_shape) - 2
    fields = {"dilations": [1] * nd, "group": 1, **fields}
    return ConvGeometry(**fields)


@pytest.mark.parametrize("x_shape,w_shape,fields", GEOMETRIES)
def test_onnxruntime_sums_equal_numpy_float64(x_shape, w_shape, fields):
    rng = np.random.default_rng(len(x_shape) * 100 + w_shape[0])
    attrs = _geometry(w_shape, fields)
    exact = ExactConvs()
    for _ in range(3):  # the same session on several inputs
        xc = rng.integers(-128, 128, x_shape).astype(np.float32)
        w = rng.integers(-127, 128, w_shape).astype(np.int8)
        reference = conv_sums(xc.astype(np.float64), w, attrs)[0]  # no sessions: numpy
        assert np.abs(xc).max() * channel_l1(w, False) < FLOAT32_EXACT
        got = conv_sums(xc, w, attrs, exact)[0]
        assert got.dtype == np.float32  # it took onnxruntime's path
        np.testing.assert_array_equal(got, reference)


@pytest.mark.parametrize("transpose", [False, True])
def test_a_caller_offering_threads_gets_the_same_sums_from_small_and_large_calls(transpose, monkeypatch):
    """ExactConvs(threads=2) (the simulator's) runs a call of PARALLEL_MACS or more on a session
    with two intra-op threads and a smaller one on a one-thread session: both give numpy's sums,
    and the two calls used the two sessions."""
    from npubuild.intmodel import ortconv

    rng = np.random.default_rng(5 + transpose)
    w_shape = (16, 8, 3, 3)
    if transpose:
        attrs = ConvGeometry(strides=[2, 2], dilations=[1, 1], pads=[0, 0, 0, 0], group=1)
    else:
        attrs = ConvGeometry(strides=[1, 1], dilations=[1, 1], pads=[1, 1, 1, 1], group=1)
    w = rng.integers(-127, 128, w_shape).astype(np.int8)
    small = rng.integers(-128, 128, (1, 16 if transpose else 8, 6, 6)).astype(np.float32)
    large = rng.integers(-128, 128, (4, 16 if transpose else 8, 24, 24)).astype(np.float32)
    per_input = ortconv._Entry(w, attrs, [0, 0, 0, 0], transpose, 2).macs_per_input
    monkeypatch.setattr(ortconv, "PARALLEL_MACS", (small.size + large.size) * per_input // 2)
    exact = ExactConvs(threads=2)
    for xc in (small, large):
        if transpose:
            got = conv_transpose_accumulate(xc, w, attrs, exact)
            want = conv_transpose_accumulate(xc.astype(np.float64), w, attrs)
        else:
            got, want = conv_sums(xc, w, attrs, exact)[0], conv_sums(xc.astype(np.float64), w, attrs)[0]
        np.testing.assert_array_equal(got, want)
    (entry,) = [e for entries in exact._entries.values() for e in entries]
    assert sorted(entry.sessions) == [1, 2]


@pytest.mark.parametrize(
    "stride,pads,output_padding,group",
    [(2, [0, 0, 0, 0], [], 1), (2, [1, 1, 1, 1], [1, 1], 1), (3, [1, 0, 2, 1], [], 2)],
)
@pytest.mark.parametrize("flagged", [True, False])
def test_transposed_sums_equal_numpy_float64(stride, pads, output_padding, group, flagged):
    """Weights [in, out / group] that a plain Conv would also accept: the transposed result must
    come back whether or not the geometry carries the flag (the simulator's tiles do not)."""
    rng = np.random.default_rng(stride * 10 + group)
    attrs = ConvGeometry(
        strides=[stride, stride],
        dilations=[1, 1],
        pads=pads,
        group=group,
        transpose=flagged,
        output_padding=output_padding,
    )
    xc = rng.integers(-128, 128, (1, 8, 6, 5)).astype(np.float32)
    w = rng.integers(-127, 128, (8, 8 // group, 3, 3)).astype(np.int8)
    reference = conv_transpose_accumulate(xc, w, attrs)
    got = conv_transpose_accumulate(xc, w, attrs, ExactConvs())
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, reference)


def test_sums_that_could_leave_float32_are_left_to_float64():
    """A 256-channel 3x3 filter of full-scale weights on full-scale int8 inputs can reach
    255 * 127 * 2304 > 2^24: refused, and numpy's float64 path gives the exact sums."""
    rng = np.random.default_rng(7)
    w = np.full((4, 256, 3, 3), 127, np.int8)
    xc = rng.integers(200, 256, (1, 256, 5, 5)).astype(np.float32)
    attrs = ConvGeometry(strides=[1, 1], dilations=[1, 1], pads=[1, 1, 1, 1], group=1)
    exact = ExactConvs()
    assert exact.sums(xc, w, attrs, [1, 1, 1, 1], False, key=None) is None
    got = conv_sums(xc, w, attrs, exact)[0]
    assert got.dtype == np.float64
    expected = np.einsum("chw,c->", xc[0, :, 1:4, 1:4].astype(np.int64), np.full(256, 127, np.int64))
    assert got[0, 0, 2, 2] == expected > FLOAT32_EXACT


def test_other_weights_under_the_same_name_get_their_own_session():
    """The simulator names a layer by its weights' SRAM address, which the next layer reuses:
    the weights are compared on every call, so a name never brings back a stale session."""
    attrs = ConvGeometry(strides=[1, 1], dilations=[1, 1], pads=[0, 0, 0, 0], group=1)
    xc = np.ones((1, 2, 3, 3), np.float32)
    exact = ExactConvs()
    one = np.ones((1, 2, 1, 1), np.int8)
    two = np.full((1, 2, 1, 1), 2, np.int8)
    for _ in range(2):
        assert exact.sums(xc, one, attrs, [0] * 4, False, key=0x400)[0].max() == 2
        assert exact.sums(xc, two, attrs, [0] * 4, False, key=0x400)[0].max() == 4
    assert exact.sums(xc, one, attrs, [0] * 4, False, key="layer")[0].max() == 2


@pytest.mark.parametrize("transpose", [False, True])
@pytest.mark.parametrize("images", [1, 3])
def test_a_16_bit_input_is_summed_as_two_byte_convolutions(transpose, images):
    """int16 codes times int8 weights overflow float32's exact range whole; split in bytes they
    do not, and the float64 combination equals numpy's float64 sums, image by image (the halves
    of every image go through the session as one batch), from float32 or int32 codes."""
    rng = np.random.default_rng(16)
    w_shape = (8, 4, 3, 3)  # Conv [out, in]; ConvTranspose [in, out]
    attrs = ConvGeometry(strides=[2, 2], dilations=[1, 1], pads=[1, 1, 1, 1], group=1, transpose=transpose)
    xc = rng.integers(-32768, 32768, (images, 8 if transpose else 4, 9, 9)).astype(np.float32)
    w = rng.integers(-127, 128, w_shape).astype(np.int8)
    assert np.abs(xc).max() * channel_l1(w, transpose) >= FLOAT32_EXACT

    def accumulate(*args):
        return conv_transpose_accumulate(*args) if transpose else conv_sums(*args)[0]

    reference = accumulate(xc.astype(np.float64), w, attrs)
    exact = ExactConvs()
    pads = [1, 1, 1, 1]
    assert exact.sums(xc, w, attrs, pads, transpose, key=None) is not None  # the byte split, not numpy's path
    np.testing.assert_array_equal(accumulate(xc, w, attrs, exact), reference)
    np.testing.assert_array_equal(accumulate(xc.astype(np.int32), w, attrs, exact), reference)
