"""Exact integer kernels of the ops that reduce along a tensor's last axis, Softmax and
LayerNormalization, shared by the golden interpreter and the NPU simulator (so the two agree by
construction and the tests check the tiling around them).

Both work on rows: codes as int64 `[rows, n]`, n the length of the last axis, which is contiguous
in the row-major layout. Everything is integer arithmetic (int64, no overflow for the bounds
stated); the only real numbers are in the tables and multipliers the quantizer computed.

Softmax (TFLite's and TPU-MLIR's scheme with a wider exponent table): d = max(row) - x >= 0 is
looked up, shifted right by `rshift`, in a table of exp(-d * s_in) in Q15 (`EXP_ONE` is exp(0));
the row's sum S of those values divides each: y = round(e * Q / S) + zp, Q = 1 / s_out. The
output grid is fixed: 1/256 with zero point -128 for int8, 1/32768 with zero point 0 for int16.

LayerNormalization over the last axis: with S = sum(xc) and SS = sum(xc^2) of the zero-point-free
codes, n * xc - S over sqrt(n * SS - S^2 + E) is the normalised value exactly (E is n^2 eps in
code units), computed as z in Q12 with an integer square root; gamma and beta are a per-element
fixed-point multiplier (m0, shift, sign included) and a bias in output codes.
"""

from __future__ import annotations

import math

import numpy as np

from npubuild.intmodel.codes import saturate
from npubuild.intmodel.fixedpoint import requantize

EXP_ONE = 1 << 15
EXP_TABLE_MAX = 4096  # entries; a wider input range is looked up at a coarser step (rshift)
SOFTMAX_GRID = {8: (1 / 256, -128), 16: (1 / 32768, 0)}  # output (scale, zero point)
Z_FRACTION_BITS = 12
D_LIMIT_BITS = 46  # D << 16 must stay below 2^62
EPS_CODES_MAX = 1 << 46  # the encoder caps n^2 eps in input codes here; an .npub beyond it is forged


def exp_table(in_scale: float, in_bits: int) -> tuple[np.ndarray, int]:
    """The Q15 table of exp(-d * in_scale) (int64) and the right shift of d that indexes it."""
    span = 2**in_bits
    rshift = max(0, math.ceil(math.log2(span / EXP_TABLE_MAX))) if span > EXP_TABLE_MAX else 0
    step = 1 << rshift
    # entry k stands for d in [k * step, (k + 1) * step): its middle, so a coarse table is unbiased;
    # entry 0 holds d = 0 itself, which every row's maximum reads (at a coarse scale the middle's
    # value can round to zero, and a row of equal logits then had no mass at all)
    middle = np.arange(-(-span // step), dtype=np.float64) * step + (step - 1) / 2
    middle[0] = 0.0
    values = np.rint(np.exp(-middle * in_scale) * EXP_ONE).astype(np.int64)
    nonzero = int(np.count_nonzero(values))  # trailing zeros need no entries: d past them gives 0
    return values[: max(nonzero, 1) + 1], rshift


def softmax_rows(x: np.ndarray, table: np.ndarray, rshift: int, out_bits: int) -> np.ndarray:
    """Softmax codes of int64 rows `[rows, n]`."""
    q_inv, zp = SOFTMAX_GRID[out_bits]
    d = x.max(axis=-1, keepdims=True) - x
    index = np.minimum(np.right_shift(d, rshift), table.size - 1)
    e = table[index]
    total = np.maximum(e.sum(axis=-1, keepdims=True), 1)
    q = round(1 / q_inv)
    y = (2 * e * q + total) // (2 * total) + zp
    return saturate(y, out_bits)


def isqrt(v: np.ndarray) -> np.ndarray:
    """floor(sqrt(v)) of int64 values in [0, 2^62), exact."""
    r = np.floor(np.sqrt(v.astype(np.float64))).astype(np.int64)
    r = np.where(r * r > v, r - 1, r)
    r = np.where(r * r > v, r - 1, r)
    r = np.where((r + 1) * (r + 1) <= v, r + 1, r)
    return r


def normalise_rows(xc: np.ndarray, eps_codes: int) -> np.ndarray:
    """(n xc - S) / sqrt(n SS - S^2 + E) in Q12, int64, for zero-point-free int64 rows."""
    n = xc.shape[-1]
    s = xc.sum(axis=-1, keepdims=True)
    ss = (xc * xc).sum(axis=-1, keepdims=True)
    t = n * xc - s
    d = n * ss - s * s + max(int(eps_codes), 1)
    # keep D << 16 below 2^62: drop 2p bits of D (and p bits of the result's scale) on wide rows
    bits = np.frexp(d.astype(np.float64))[1].astype(np.int64)
    p = np.maximum((bits - D_LIMIT_BITS + 1) // 2, 0)
    sd = np.maximum(isqrt(np.left_shift(np.right_shift(d, 2 * p), 16)), 1)  # sqrt(D) 2^(8 - p)
    num = t * np.left_shift(np.int64(1), Z_FRACTION_BITS + 8 - p)
    return _divide_rounded(num, sd)


def _divide_rounded(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """num / den (den > 0) rounded half away from zero."""
    mag = (2 * np.abs(num) + den) // (2 * den)
    return np.where(num < 0, -mag, mag)


def layernorm_rows(
    x: np.ndarray, in_zp: int, eps_codes: int, params: np.ndarray, out_zp: int, out_bits: int
) -> np.ndarray:
    """LayerNormalization codes of int64 rows; `params` int64 `[n, 3]` = (m0, shift, bias codes)."""
    z = normalise_rows(x - in_zp, eps_codes)
    y = requantize(z, params[:, 0], params[:, 1]) + params[:, 2] + out_zp
    return saturate(y, out_bits)
