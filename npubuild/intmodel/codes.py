"""Integer codes: the representable range of a bit width, saturation, and the conversions
between float values and codes (ONNX QuantizeLinear and DequantizeLinear semantics)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from npubuild.intmodel.program import TensorQuant


def qrange(bits: int) -> tuple[int, int]:
    return -(2 ** (bits - 1)), 2 ** (bits - 1) - 1


def quantize_float(x: np.ndarray, t: TensorQuant) -> np.ndarray:
    """ONNX QuantizeLinear: x / scale in float32, round half to even, add zero point, saturate."""
    qmin, qmax = qrange(t.bits)
    scaled = np.asarray(x, np.float32) / np.float32(t.scale)
    return np.clip(np.rint(scaled).astype(np.int64) + t.zero_point, qmin, qmax).astype(np.int32)


def dequantize(q: np.ndarray, t: TensorQuant) -> np.ndarray:
    return ((q.astype(np.int64) - t.zero_point) * np.float64(t.scale)).astype(np.float32)


def saturate(v: np.ndarray, bits: int) -> np.ndarray:
    """Clip to the range of `bits` (the array keeps its dtype)."""
    qmin, qmax = qrange(bits)
    return np.clip(v, qmin, qmax)


def fits_integer(array: np.ndarray, dtype: np.dtype) -> bool:
    """Whether every value of an integer array is one integer `dtype` holds (a cast there and back
    would not notice a sign wrapped: uint64 2**63 is int64 -2**63)."""
    info = np.iinfo(dtype)
    return array.size == 0 or (int(array.min()) >= info.min and int(array.max()) <= info.max)


def centred_bound(bits: int, zero_point: int) -> int:
    """A bound on |code - zero point| for every `bits`-wide code: what a convolution's exactness
    check may take instead of reading its input for the largest value."""
    return 2 ** (bits - 1) + abs(zero_point)


def per_code(fn: Callable[[np.ndarray], np.ndarray], x: np.ndarray, bits: int) -> np.ndarray:
    """fn(x) for an element-wise fn of `bits`-wide integer codes x: when x holds far more elements
    than its codes can take, fn is computed once for every code and the result gathered (the same
    values, one pass over x instead of fn's several)."""
    if x.size < 4 << bits:
        return fn(x.astype(np.int64))
    lo, hi = qrange(bits)
    table = fn(np.arange(lo, hi + 1, dtype=np.int64))
    return np.take(table, np.subtract(x, lo, dtype=np.int32))


def elementwise(
    fn: Callable[[np.ndarray, np.ndarray], np.ndarray],
    a: np.ndarray,
    a_bits: int | None,
    b: np.ndarray,
    b_bits: int | None,
) -> np.ndarray:
    """fn(a, b) for an element-wise fn of two code arrays that broadcast. When one side is a
    single value and the other holds far more elements than its codes can take (an affine
    scale or offset by a constant over a feature map), fn is computed once for every code of the
    large side and the result gathered from that table: the same values (fn is element-wise),
    two passes over the feature map instead of the dozen of fn's int64 arithmetic."""
    for big, bits, small, big_first in ((a, a_bits, b, True), (b, b_bits, a, False)):
        if bits is None or small.size != 1 or small.ndim > big.ndim or big.size < 4 << bits:
            continue
        one = small.reshape(())
        if big_first:
            return per_code(lambda codes, one=one: fn(codes, one), big, bits)
        return per_code(lambda codes, one=one: fn(one, codes), big, bits)
    return fn(a, b)
