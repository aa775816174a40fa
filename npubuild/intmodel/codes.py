"""Integer codes: the representable range of a bit width, saturation, and the conversions
between float values and codes (ONNX QuantizeLinear and DequantizeLinear semantics)."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from npubuild.intmodel.program import TensorQuant, grid_scales


def qrange(bits: int) -> tuple[int, int]:
    return -(2 ** (bits - 1)), 2 ** (bits - 1) - 1


def quantize_float(x: np.ndarray, t: TensorQuant) -> np.ndarray:
    """ONNX QuantizeLinear: x / scale in float32, round half to even, add zero point, saturate
    (per channel along axis 1 for a per-channel grid)."""
    qmin, qmax = qrange(t.bits)
    x = np.asarray(x, np.float32)
    scale = t.channel_scales(x.ndim).astype(np.float32) if t.channel_shifts else np.float32(t.scale)
    scaled = x / scale
    return np.clip(np.rint(scaled).astype(np.int64) + t.zero_point, qmin, qmax).astype(np.int32)


def qdq_grid(grid) -> tuple[np.ndarray, np.ndarray, str, dict]:
    """The QuantizeLinear/DequantizeLinear parameters of a grid (a TensorQuant or the planner's
    TensorParams): float32 scales and zero points of the code type, one each or one per channel,
    the ops' domain (int16: onnxruntime's com.microsoft) and their attributes (axis 1 for a
    per-channel grid)."""
    scales = np.asarray(grid_scales(grid.scale, grid.channel_shifts), np.float32)
    zero_points = np.full(scales.shape, grid.zero_point, np.int8 if grid.bits == 8 else np.int16)
    return (
        scales,
        zero_points,
        "" if grid.bits == 8 else "com.microsoft",
        {"axis": 1} if grid.channel_shifts else {},
    )


def dequantize(q: np.ndarray, t: TensorQuant) -> np.ndarray:
    return ((q.astype(np.int64) - t.zero_point) * t.channel_scales(q.ndim)).astype(np.float32)


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


def per_code(
    fn: Callable[[np.ndarray], np.ndarray],
    x: np.ndarray,
    bits: int,
    tables: dict | None = None,
    key: object = None,
) -> np.ndarray:
    """fn(x) for an element-wise fn of `bits`-wide integer codes x: when x holds far more elements
    than its codes can take, fn is computed once for every code and the result gathered (the same
    values, one pass over x instead of fn's several). `tables`, with the caller's `key` for fn,
    keeps the table for the next call of the same fn (a simulator's stream requantizes tile after
    tile alike)."""
    if x.size < 4 << bits:
        return fn(x.astype(np.int64))
    table = None if tables is None else tables.get(key)
    if table is None:
        lo, hi = qrange(bits)
        table = code_indexed(fn(np.arange(lo, hi + 1, dtype=np.int64)), lo)
        if tables is not None:
            tables[key] = table
    return table[x]


def looked_up(table: np.ndarray, x: np.ndarray, offset: int, index_shift: int = 0) -> np.ndarray:
    """table[(x + offset) >> index_shift] (a lookup-table op: `offset` is the index of code 0 in a
    table with one entry per code; a shifted table has one entry per 2^index_shift codes)."""
    if index_shift:
        table = np.repeat(table, 1 << index_shift)
    if offset == 0:  # indices from 0 up: np.take's fast path, about twice fancy indexing's speed
        return np.take(table.reshape(-1), x)
    if 0 <= offset < table.size:  # the codes index the table as they are: no pass adding the offset
        return code_indexed(table, -offset)[x]
    return table[np.add(x, offset, dtype=np.int32)]


def code_indexed(table: np.ndarray, first: int) -> np.ndarray:
    """`table` (entry i for key first + i, first <= 0 < first + len) rotated so that a key indexes
    it directly: numpy reads a negative index from the end. A gather by the keys themselves saves
    the pass that would add -first to every key (and on negative keys numpy's fancy indexing is
    several times np.take's speed; on keys from 0 up np.take is the faster, looked_up)."""
    flat = table.reshape(-1)
    return np.concatenate((flat[-first:], flat[:-first])) if first else flat  # np.roll: 10x the call cost


# A gathered table's entries: 8-bit by 8-bit codes (256 KB of int32, in the processor's cache).
TABLE_ENTRIES = 1 << 16
ENUMERATED = 1 << 10  # an operand of at most this many elements may be a table axis of its own


class _Keys:
    """One operand of an element-wise op seen as a table axis: every value its elements can take
    (`values`, int64) and per element the key of its value (`keys`, the operand's shape), the
    value of key k being values[k - first]."""

    def __init__(self, x: np.ndarray, bits: int | None):
        if bits is not None and 1 << bits <= x.size:  # a feature map: each code is its own key
            self.first = qrange(bits)[0]
            self.values = np.arange(self.first, self.first + (1 << bits), dtype=np.int64)
            self.keys = x
        else:  # a constant, a gate or a bias: each element is its own key
            self.first = 0
            self.values = np.asarray(x, np.int64).reshape(-1)
            self.keys = np.arange(x.size, dtype=np.int32).reshape(x.shape)


def elementwise(
    fn: Callable[[np.ndarray, np.ndarray], np.ndarray],
    a: np.ndarray,
    a_bits: int | None,
    b: np.ndarray,
    b_bits: int | None,
) -> np.ndarray:
    """fn(a, b) for an element-wise fn of two code arrays that broadcast (`bits` None: a
    constant, whose values are not codes of a known width).

    When both operands take few enough values (8-bit codes, or a small array such as a scalar or
    a per-channel constant) and the result has more elements than their pairs, fn is computed
    once for every pair and the result gathered from that table: the same values (fn is
    element-wise), one or two int32 passes and a gather over the feature map instead of the dozen
    passes of fn's int64 arithmetic."""
    size = math.prod(np.broadcast_shapes(np.shape(a), np.shape(b)))
    sides = []
    for x, bits in ((a, a_bits), (b, b_bits)):
        if bits is None and x.size > ENUMERATED:
            return fn(a, b)
        sides.append(_Keys(x, bits))
    ka, kb = sides
    entries = len(ka.values) * len(kb.values)
    if entries > min(TABLE_ENTRIES, size):
        return fn(a, b)
    # the operand with more elements is the minor axis: its keys are used as they are
    if a.size <= b.size:
        major, minor, table = ka, kb, fn(ka.values[:, None], kb.values[None, :])
    else:
        major, minor, table = kb, ka, fn(ka.values[None, :], kb.values[:, None])
    width = len(minor.values)
    if len(major.values) == 1 and minor.keys.ndim >= major.keys.ndim:
        index = minor.keys
    else:
        index = np.multiply(major.keys, width, dtype=np.int32) if width > 1 else major.keys
        index = np.add(index, minor.keys, dtype=np.int32)
    return code_indexed(table, major.first * width + minor.first)[index]
