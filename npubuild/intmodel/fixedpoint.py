"""Fixed-point requantisation: a real multiplier M as an int32 M0 and a right shift.

M = M0 * 2^-(31 + shift), M0 in [2^30, 2^31). Rounding rule (the only one used anywhere):
round half away from zero, i.e. r(v / 2^n) = sign(v) * floor((|v| + 2^(n-1)) / 2^n).
Products that would not fit int64 (16-bit layers) are split in two exact halves.
"""

from __future__ import annotations

import math
from functools import lru_cache, partial

import numpy as np

from npubuild.intmodel.codes import qrange, saturate


def quantize_multiplier(m: float) -> tuple[int, int]:
    """(M0, shift) with m ~= M0 * 2^-(31 + shift); m == 0 gives (0, 0)."""
    if m <= 0 or not math.isfinite(m):
        return 0, 0
    mantissa, exponent = math.frexp(m)  # m = mantissa * 2^exponent, mantissa in [0.5, 1)
    m0 = int(round(mantissa * (1 << 31)))
    if m0 == 1 << 31:
        m0 //= 2
        exponent += 1
    shift = -exponent
    if shift < -31:  # multipliers >= 2^31 are not representable; saturate
        return (1 << 31) - 1, -31
    if shift > 62 - 31:  # below 2^-62 the result rounds to 0 for any int32 accumulator
        return 0, 0
    return m0, shift


def rounding_shift(values: np.ndarray, n: np.ndarray | int) -> np.ndarray:
    """values / 2^n rounded half away from zero (int64 in, int64 out); n >= 0."""
    return _rounding_shift_in_place(np.array(values, dtype=np.int64), n)


def _rounding_shift_in_place(v: np.ndarray, n: np.ndarray | int) -> np.ndarray:
    """rounding_shift of an int64 array the caller owns, overwriting it: the golden interpreter's
    tensors are large and memory-bound, so every temporary of their size costs a pass."""
    n = np.asarray(n, dtype=np.int64)
    if np.broadcast_shapes(v.shape, n.shape) != v.shape:  # n has axes v lacks
        v = np.array(np.broadcast_to(v, np.broadcast_shapes(v.shape, n.shape)))
    half = np.where(n > 0, np.left_shift(np.int64(1), np.maximum(n - 1, 0)), 0)
    # -floor((-v + h) / 2^n) == floor((v + h - 1) / 2^n) for v < 0 and h = 2^(n-1): one
    # arithmetic shift instead of abs / shift / negate / select
    if n.size and n.min() > 0:  # the usual case: v + (h - 1) + [v >= 0]
        nonnegative = v >= 0
        v += half - 1
        v += nonnegative
    else:
        negative_and_shifted = (v < 0) & (n > 0)
        v += half
        v -= negative_and_shifted
    return np.right_shift(v, n, out=v)


def channel_shifted(entries: np.ndarray, shifts) -> np.ndarray:
    """A per-channel grid's int8 codes from a table's 16-bit entries on its base grid: channel c
    (axis 1) shifted right by shifts[c], rounding half away from zero, saturated."""
    n = np.asarray(shifts, np.int64).reshape((1, -1) + (1,) * (entries.ndim - 2))
    return saturate(rounding_shift(entries, n), 8).astype(np.int32)


def requantize(acc: np.ndarray, m0: np.ndarray | int, shift: np.ndarray | int) -> np.ndarray:
    """acc * M0 * 2^-(31 + shift), rounded; shift may be negative (a multiplier above 1).

    Exact for |acc| < 2^48 (int16 layers' accumulators and 48-bit biases times a 31-bit M0 do not
    fit int64: those go through `_requantize_wide`); a result of magnitude 2^16 or more, which
    every caller saturates to at most 16 bits, may come back as +-2^40."""
    acc = np.asarray(acc, dtype=np.int64)
    m0 = np.asarray(m0, dtype=np.int64)
    total = 31 + np.asarray(shift, dtype=np.int64)
    left = np.maximum(-total, 0)
    acc_bound = max(abs(int(acc.max(initial=0))), abs(int(acc.min(initial=0))))
    if acc_bound * int(m0.max(initial=0)) << int(left.max(initial=0)) >= WIDE_PRODUCT:
        return _requantize_wide(acc, m0, total)
    right = np.maximum(total, 0)
    scaled = np.left_shift(acc, left) * m0 if left.any() else acc * m0
    return _rounding_shift_in_place(scaled, right)


# Products from here on would overflow int64 in the one-multiply path (2^62 leaves room for the
# rounding half).
WIDE_PRODUCT = 1 << 62
_SPLIT = 24  # |acc| < 2^48 splits in two 24-bit halves; each half times M0 < 2^31 stays below 2^55
_SATURATED = np.int64(1 << 40)


def _requantize_wide(acc: np.ndarray, m0: np.ndarray, total: np.ndarray) -> np.ndarray:
    """requantize when acc * M0 may reach 2^63: on |acc| (rounding half away from zero is
    symmetric), acc = high * 2^24 + low. For a right shift n >= 24,
    floor((high M0 2^24 + low M0 + 2^(n-1)) / 2^n) = (high M0 + ((low M0 + 2^(n-1)) >> 24)) >> (n - 24)
    and every term stays below 2^63. A shift below 24 with a nonzero high half gives at least
    2^31, saturated by every caller, so it is returned as 2^40; so is any result from 2^39 up, and
    any |acc| from 2^48 up (at least 2^16 after the largest shift, 62)."""
    magnitude = np.abs(acc)
    beyond = magnitude >= 1 << (2 * _SPLIT)  # a result of 2^16 or more: saturated by every caller
    magnitude = np.where(beyond, 0, magnitude)
    high, low = magnitude >> _SPLIT, magnitude & ((1 << _SPLIT) - 1)
    n = np.broadcast_to(total, np.broadcast_shapes(magnitude.shape, np.shape(total), np.shape(m0)))
    wide_shift = n >= _SPLIT
    half = np.left_shift(np.int64(1), np.maximum(n - 1, 0)) * (n > 0)
    split = (high * m0 + ((low * m0 + np.where(wide_shift, half, 0)) >> _SPLIT)) >> np.maximum(n - _SPLIT, 0)
    # short shifts: the value itself, where float64 says it is small enough to form exactly
    approximate = magnitude.astype(np.float64) * m0 * np.ldexp(1.0, -n)
    small = ~wide_shift & (approximate < 2.0**39)
    product = np.where(small, magnitude, 0) * m0
    short = np.where(n > 0, (product + half) >> np.maximum(n, 0), np.left_shift(product, np.maximum(-n, 0)))
    result = np.where(wide_shift, split, np.where(small, short, _SATURATED))
    result = np.where(beyond, _SATURATED, np.minimum(result, _SATURATED))
    return np.where(acc < 0, -result, result)


# float64 holds every integer below 2^53: (acc + bias) * M0 * 2^left below 2^52 leaves room for the
# rounding half, so the product, its scaling by a power of two and the rounding are all exact.
FLOAT64_EXACT_PRODUCT = float(1 << 52)


def requantize_output(
    acc: np.ndarray,
    bias: np.ndarray,
    m0: np.ndarray,
    shift: np.ndarray,
    axis: int,
    zero_point: int,
    lo: int,
    hi: int,
    acc_bound: float | None = None,
) -> np.ndarray:
    """A MAC op's output path: acc + bias (acc holds exact integers, any numeric dtype; bias, m0
    and shift one value per channel along `axis`) requantized by (m0, shift), plus the zero point,
    clipped to [lo, hi], as int32 codes. `acc_bound`, when the caller knows one, bounds |acc| and
    spares reading acc for it. OutputRule holds what this works out from the parameters, for a
    caller that applies them again and again."""
    return OutputRule(bias, m0, shift, axis, acc.ndim, zero_point, lo, hi).apply(acc, acc_bound)


class OutputRule:
    """requantize_output's parameters, worked out once for a layer (or a simulator's tile shape).

    The rule is requantize's, computed in float64 when that gives its codes
    (`float64_rounding_is_exact`; the usual case), whose multiply and add are vector instructions
    where int64's multiply is not: p = (acc + bias) M0 2^-n in float64, rounded half away from
    zero in int32 (`_float64_block`). Large outputs go in blocks of channels (of about
    CHUNK_ELEMENTS) whose temporaries stay in the processor's cache; every pass of this
    memory-bound arithmetic over a whole feature map would go to DRAM."""

    def __init__(self, bias, m0, shift, axis: int, ndim: int, zero_point: int, lo: int, hi: int):
        shape = [1] * ndim
        shape[axis] = -1
        # copies: a caller may pass views of a memory that is written later (the simulator's
        # parameters in SRAM) and keep the rule for the next tile that reads the same parameters
        self.bias, m0, self.shift = (np.array(p).reshape(shape) for p in (bias, m0, shift))
        self.m0 = m0.astype(np.int64)
        total = 31 + self.shift.astype(np.int64)
        self.scale = np.ldexp(self.m0.astype(np.float64), -total)
        # |acc + bias| below this: the float64 form is exact (float64_rounding_is_exact)
        self.exact_below = exact_sum_limit(self.m0, total, lo - zero_point, hi - zero_point)
        self.bias_bound = float(np.abs(self.bias).max(initial=0))
        # the float64 form's operands as it reads them: the bias in float64 (exact wherever that
        # form runs, below exact_below; an int64 bias makes numpy's add cast through a buffer)
        # and 2 M0 2^-n (a power of two's multiple: exact)
        self.float_bias = self.bias.astype(np.float64)
        self.twice_scale = 2 * self.scale
        # Python ints: a numpy int64 bound would make the int32 passes below run in int64
        self.axis, self.zero_point, self.lo, self.hi = axis, int(zero_point), int(lo), int(hi)

    def apply(
        self, acc: np.ndarray, acc_bound: float | None = None, offset: int = 0, shift: int = 0
    ) -> np.ndarray:
        """The output codes; with `offset` and `shift`, (code + offset) >> shift instead: the
        index of a table read in the output path (one entry per 2^shift codes), made in the same
        passes as the codes, not in two more over them."""

        def exact_in_float64(bound: float) -> bool:
            return bound + self.bias_bound < self.exact_below

        # the caller's bound first; when it is too loose to decide, the largest |acc| itself
        if acc_bound is None or not exact_in_float64(acc_bound):
            acc_bound = max(abs(float(acc.max(initial=0))), abs(float(acc.min(initial=0))))
        if exact_in_float64(acc_bound):
            params = (self.float_bias, self.twice_scale)
            block_rule = _float64_block
        else:
            params = (self.bias, self.m0, self.shift)
            block_rule = _int64_block
        block_rule = partial(
            block_rule, zero_point=self.zero_point, lo=self.lo, hi=self.hi, offset=offset, index_shift=shift
        )
        axis = self.axis
        channels = acc.shape[axis]
        per_block = max(1, CHUNK_ELEMENTS * channels // max(acc.size, 1))
        if per_block >= channels:
            return block_rule(acc, *params)
        out = np.empty(acc.shape, np.int32)
        for start in range(0, channels, per_block):
            block = (slice(None),) * axis + (slice(start, start + per_block),)
            out[block] = block_rule(acc[block], *(p[block] for p in params))
        return out


CHUNK_ELEMENTS = 1 << 17


def _float64_block(
    acc: np.ndarray,
    bias,
    twice_scale,
    zero_point: int,
    lo: int,
    hi: int,
    offset: int = 0,
    index_shift: int = 0,
) -> np.ndarray:
    """requantize_output's float64 form on one block (bias in float64, twice_scale = 2 M0 2^-n
    per channel), as codes or, with `offset` and `index_shift`, as (code + offset) >> index_shift.

    Rounding half away from zero without float64's copysign (several times slower than its add):
    w = trunc(2p) in int32, then (w + 1 + (w >> 31)) >> 1 with an arithmetic shift. For p = k + f
    >= 0, w = 2k + [f >= 1/2] and the shift gives k + [f >= 1/2]; for p < 0 with w < 0 it gives
    floor(w / 2), -(k + [f >= 1/2]) for p = -(k + f); w = 0 gives 0. 2p is p's own rounding
    scaled by two (exact), so nothing rounds after the product.

    2p is clipped to [2 (lo - zp), 2 (hi - zp)] before the cast (which truncates toward zero and
    then cannot overflow): the rounding maps both ends to themselves and is monotone, so the codes
    come out inside [lo, hi] with no clip after it. The zero point, the offset and the index's
    shift join the rounding's shift: floor((floor(a / 2) + c) / 2^s) = floor((a + 2c) / 2^(s + 1))
    for integers."""
    v = np.add(acc, bias, dtype=np.float64)  # exact: integers below 2^53
    v *= twice_scale
    np.clip(v, 2 * (lo - zero_point), 2 * (hi - zero_point), out=v)
    w = v.astype(np.int32)
    w += w >> 31
    w += 1 + 2 * (zero_point + offset)
    w >>= 1 + index_shift
    return w


def _int64_block(
    acc: np.ndarray, bias, m0, shift, zero_point: int, lo: int, hi: int, offset: int = 0, index_shift: int = 0
) -> np.ndarray:
    """requantize_output's int64 form on one block: requantize itself (then, as the float64
    form, the table index if asked for)."""
    v = requantize(np.asarray(acc).astype(np.int64) + bias.astype(np.int64), m0, shift)
    v += zero_point
    np.clip(v, lo, hi, out=v)
    if offset or index_shift:
        v += offset
        v >>= index_shift
    return v.astype(np.int32)


def float64_rounding_is_exact(sum_bound: float, m0: np.ndarray, total: np.ndarray, lo: int, hi: int) -> bool:
    """Whether round-half-away-from-zero of p = s M0 2^-total, clipped to [lo, hi], comes out
    exact when p is the float64 product (its one rounding; the rounding to an integer after it is
    exact, _float64_block) for every integer |s| <= sum_bound: s exact (below 2^53), and for
    every channel (its m0 and total) one of

    - every product s M0 2^max(-total, 0) below 2^52: p is exact;
    - |p| <= 1/4: the product stays inside (-1/2, 1/2), which rounds to 0;
    - (2B + 2) 2^total <= 2^53 with B = min(max(|lo|, |hi|) + 1, the largest |p|): p is a
      multiple of 2^-total, so p is a tie (k + 1/2) or at least 2^-total away from one, while
      for |p| <= B the product's rounding moves it by at most B 2^-53, less than that; a tie is
      representable, so the product gives it exactly; beyond B the rounding is monotone and the
      clip saturates alike. (The bound keeps the margin of an earlier form that also rounded an
      added half: twice what this one needs.)"""
    return sum_bound < exact_sum_limit(m0, total, lo, hi)


def exact_sum_limit(m0: np.ndarray, total: np.ndarray, lo: int, hi: int) -> float:
    """The bound on |s| below which float64_rounding_is_exact holds."""
    m0, total = (np.ascontiguousarray(v, np.int64).reshape(-1) for v in np.broadcast_arrays(m0, total))
    return _exact_sum_limit(m0.tobytes(), total.tobytes(), lo, hi)


@lru_cache(maxsize=4096)
def _exact_sum_limit(m0_bytes: bytes, total_bytes: bytes, lo: int, hi: int) -> float:
    """The bound on |s| below which float64_rounding_is_exact holds for every channel: a layer's
    multipliers and bounds are the same on every call, its accumulators' bound is not."""
    m0 = np.abs(np.frombuffer(m0_bytes, np.int64).astype(np.float64))
    total = np.frombuffer(total_bytes, np.int64)
    with np.errstate(divide="ignore"):
        products_exact = FLOAT64_EXACT_PRODUCT / np.ldexp(m0, np.maximum(-total, 0))
        multiplier = np.ldexp(m0, -total)
        rounds_to_zero = 0.25 / multiplier
        step = np.ldexp(1.0, np.minimum(total, 1023))
        within_range = (2 * (max(abs(lo), abs(hi)) + 1) + 2) * step <= FLOAT64_EXACT_SUM
        small_enough = (FLOAT64_EXACT_SUM / step - 2) / (2 * multiplier)  # (2 |p| + 2) 2^total <= 2^53
    rounding_exact = np.where(within_range, np.inf, small_enough)
    limit = np.maximum(np.maximum(products_exact, rounds_to_zero), rounding_exact)
    return min(float(limit.min(initial=np.inf)), FLOAT64_EXACT_SUM)


FLOAT64_EXACT_SUM = float(1 << 53)


# Element-wise adds rescale both sides to a common fixed-point grid with this many fraction bits.
ADD_FRACTION_BITS = 20


def add_multiplier(ratio: float) -> int:
    return int(round(ratio * (1 << ADD_FRACTION_BITS)))


def add_rescaled(a: np.ndarray, za: int, ma: int, b: np.ndarray, zb: int, mb: int) -> np.ndarray:
    """The element-wise add's sum before its zero point: both sides on the common grid of
    ADD_FRACTION_BITS fraction bits, added and rounded back (int64; a and b broadcast)."""
    x = np.subtract(a, za, dtype=np.int64)
    x *= ma
    y = np.subtract(b, zb, dtype=np.int64)
    y *= mb
    total = np.add(x, y, out=x) if x.shape == np.broadcast_shapes(x.shape, y.shape) else x + y
    return _rounding_shift_in_place(total, ADD_FRACTION_BITS)


def multiply_requantized(a: np.ndarray, za: int, b: np.ndarray, zb: int, m0: int, shift: int) -> np.ndarray:
    """The element-wise product (a - za) * (b - zb) requantised by (m0, shift), before its zero
    point (int64; a and b broadcast)."""
    x = np.subtract(a, za, dtype=np.int64)
    y = np.subtract(b, zb, dtype=np.int64)
    product = np.multiply(x, y, out=x) if x.shape == np.broadcast_shapes(x.shape, y.shape) else x * y
    return requantize(product, m0, shift)


def output_codes(v: np.ndarray, zero_point: int, bits: int) -> np.ndarray:
    """Codes (int64) of an int64 result before its zero point, saturated to `bits` (v, which the
    caller owns, is overwritten: one pass fewer)."""
    v += zero_point
    return np.clip(v, *qrange(bits), out=v)


def add_codes(a, za: int, ma: int, b, zb: int, mb: int, zero_point: int, bits: int) -> np.ndarray:
    """The element-wise add's output codes, int64 (the golden interpreter's and the simulator's)."""
    return output_codes(add_rescaled(a, za, ma, b, zb, mb), zero_point, bits)


def multiply_codes(a, za: int, b, zb: int, m0: int, shift: int, zero_point: int, bits: int) -> np.ndarray:
    """The element-wise multiply's output codes, int64 (the golden interpreter's and the simulator's)."""
    return output_codes(multiply_requantized(a, za, b, zb, m0, shift), zero_point, bits)
