"""Choosing an activation's clipping range [lo, hi] from its statistics, by method.

Every method returns a range that contains 0, so that zero is exactly representable.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from npubuild.stages.quantize.histogram import BINS
from npubuild.stages.reductions import dot


def _centers(radius: float) -> np.ndarray:
    edges = np.linspace(-radius, radius, BINS + 1)
    return (edges[:-1] + edges[1:]) / 2


def _with_zero(lo: float, hi: float) -> tuple[float, float]:
    return min(lo, 0.0), max(hi, 0.0)


def minmax(
    stats: dict, hist: np.ndarray, bits: int, symmetric: bool, percentile: float
) -> tuple[float, float]:
    return _with_zero(stats["min"], stats["max"])


def percentile_range(stats: dict, hist: np.ndarray, bits: int, symmetric: bool, percentile: float):
    total = hist.sum()
    if total == 0:
        return _with_zero(stats["min"], stats["max"])
    cdf = np.cumsum(hist) / total
    centers = _centers(stats["radius"])
    tail = (100.0 - percentile) / 100.0
    lo = centers[min(np.searchsorted(cdf, tail), BINS - 1)] if stats["min"] < 0 else 0.0
    hi = centers[min(np.searchsorted(cdf, 1 - tail), BINS - 1)] if stats["max"] > 0 else 0.0
    return _with_zero(max(lo, stats["min"]), min(hi, stats["max"]))


def _occupied_bins(stats: dict, hist: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """(centers, counts) of the histogram's non-empty bins; None for an empty histogram."""
    if hist.sum() == 0:
        return None
    nz = hist > 0
    return _centers(stats["radius"])[nz], hist[nz].astype(np.float64)


def _expected_error(centers, counts, lo, hi, levels):
    """Expected squared error of uniform quantization to `levels` steps over [lo, hi]:
    rounding noise step^2/12 inside, squared distance to the bound outside."""
    step = (hi - lo) / (levels - 1)
    inside = (centers >= lo) & (centers <= hi)
    err = np.where(
        inside, step * step / 12.0, np.where(centers < lo, (lo - centers) ** 2, (centers - hi) ** 2)
    )
    return dot(counts, err)


def mse(stats: dict, hist: np.ndarray, bits: int, symmetric: bool, percentile: float):
    lo0, hi0 = _with_zero(stats["min"], stats["max"])
    occupied = _occupied_bins(stats, hist)
    if occupied is None or hi0 == lo0:
        return lo0, hi0
    centers, counts = occupied
    levels = 2**bits
    best, best_err = (lo0, hi0), np.inf
    # Shrink the range towards zero; both ends by the same factor keeps the zero point.
    for factor in np.linspace(0.05, 1.0, 96):
        lo, hi = lo0 * factor, hi0 * factor
        if symmetric:
            t = max(-lo, hi)
            lo, hi = -t, t
        e = _expected_error(centers, counts, lo, hi, levels)
        if e < best_err:
            best, best_err = (lo, hi), e
    return best


def mse_through(
    stats: dict,
    hist: np.ndarray,
    bits: int,
    fn: Callable[[np.ndarray], np.ndarray] | None,
    grid: int = 48,
    levels: int | None = None,
    symmetric: bool = False,
    averaged: int = 1,
) -> tuple[float, float]:
    """The asymmetric range with the smallest expected squared error, its two ends searched
    independently (`mse` shrinks both by one factor, which keeps a symmetric grid symmetric).
    With `fn`, the element-wise function that alone reads the tensor (a lookup-table
    activation), the error is measured *after* it: rounding noise inside weighted by fn'(x)^2,
    fn(x) - fn(bound) outside. Where fn is flat (HardSwish below -3, a Sigmoid's tails) clipping
    costs nothing, so the grid's steps go where the function's output still changes.
    Chosen on the validation split of benchmarks/ptq_vs_ort.py (docs/quantization.md).
    `levels` (default 2^bits): the steps the reader tells apart (a shifted table's entries);
    `symmetric`: one end, [-t, t] (16-bit grids have zero point 0). `averaged`: the values an
    average pool that alone reads the tensor takes the mean of; their rounding noise, independent,
    shrinks N times in the mean, while a clipped value's error is counted whole (large values
    cluster, so their errors add rather than cancel)."""
    fn = fn or (lambda v: v)
    lo0, hi0 = _with_zero(stats["min"], stats["max"])
    occupied = _occupied_bins(stats, hist)
    if occupied is None or hi0 == lo0:
        return lo0, hi0
    centers, counts = occupied
    h = stats["radius"] / BINS  # half a bin: the slope over one bin's width
    y = fn(centers.astype(np.float32)).astype(np.float64)
    rise = fn((centers + h).astype(np.float32)).astype(np.float64) - fn((centers - h).astype(np.float32))
    noise_weight = (rise / (2 * h)) ** 2 / 12.0 / averaged  # fn'(x)^2 * step^2 / 12 per unit step^2
    factors = np.linspace(1.0 / grid, 1.0, grid)
    levels = levels or 2**bits
    if symmetric:
        return _symmetric_through(centers, counts, y, noise_weight, max(-lo0, hi0) * factors, levels, fn)
    los = np.unique(lo0 * factors) if lo0 < 0 else np.zeros(1)
    his = np.unique(hi0 * factors) if hi0 > 0 else np.zeros(1)
    qmin, qmax = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    best, best_err = (lo0, hi0), np.inf
    for lo in los:
        # every upper end at once, each judged on the grid it becomes: the zero point is an
        # integer, so a range's lower end moves to the nearest step (a lower end within half a
        # step of zero is zero: every negative value clipped, a bias the next layer sums)
        steps = (his - lo) / (levels - 1)
        zero_points = np.clip(np.round(qmin - lo / np.where(steps > 0, steps, 1.0)), qmin, qmax)
        lo_e, hi_e = (qmin - zero_points) * steps, (qmax - zero_points) * steps
        f_lo = fn(lo_e.astype(np.float32)).astype(np.float64)
        f_hi = fn(hi_e.astype(np.float32)).astype(np.float64)
        below = centers[None, :] < lo_e[:, None]
        above = centers[None, :] > hi_e[:, None]
        err = np.where(
            above,
            (y[None, :] - f_hi[:, None]) ** 2,
            np.where(below, (y[None, :] - f_lo[:, None]) ** 2, noise_weight[None, :] * (steps**2)[:, None]),
        )
        # each row summed in the same fixed order as reductions.dot
        errors = np.multiply(counts[None, :], err, dtype=np.float64).sum(axis=1)
        for i, e in enumerate(errors):
            if e < best_err:
                best, best_err = (float(lo_e[i]), float(hi_e[i])), e
    return best


def _symmetric_through(centers, counts, y, noise_weight, ends, levels, fn) -> tuple[float, float]:
    """mse_through's search over symmetric ranges [-t, t], every candidate t at once."""
    f_lo = fn((-ends).astype(np.float32)).astype(np.float64)
    f_hi = fn(ends.astype(np.float32)).astype(np.float64)
    below = centers[None, :] < -ends[:, None]
    above = centers[None, :] > ends[:, None]
    steps = 2 * ends / (levels - 1)
    err = np.where(
        below,
        (y[None, :] - f_lo[:, None]) ** 2,
        np.where(above, (y[None, :] - f_hi[:, None]) ** 2, noise_weight[None, :] * (steps**2)[:, None]),
    )
    errors = np.multiply(counts[None, :], err, dtype=np.float64).sum(axis=1)
    t = float(ends[int(np.argmin(errors))])
    return -t, t


def kl(stats: dict, hist: np.ndarray, bits: int, symmetric: bool, percentile: float):
    """TensorRT-style entropy calibration on the histogram of |x|."""
    lo0, hi0 = _with_zero(stats["min"], stats["max"])
    half = BINS // 2
    absolute = hist[half:][:] + hist[:half][::-1]
    total = absolute.sum()
    if total == 0:
        return lo0, hi0
    target = 2 ** (bits - 1)
    last = int(np.max(np.nonzero(absolute)[0])) + 1
    if last <= target:
        return lo0, hi0
    width = stats["radius"] / half
    best_i, best_div = last, np.inf
    for i in range(target, last + 1, max(1, (last - target) // 256)):
        reference = absolute[:i].astype(np.float64).copy()
        reference[i - 1] += absolute[i:].sum()
        chunks = np.array_split(absolute[:i].astype(np.float64), target)
        expanded = []
        for chunk in chunks:
            nonzero = chunk > 0
            mass = chunk.sum()
            share = mass / nonzero.sum() if nonzero.any() else 0.0
            expanded.append(np.where(nonzero, share, 0.0))
        q = np.concatenate(expanded)
        p = reference / reference.sum()
        qs = q.sum()
        if qs == 0:
            continue
        q = q / qs
        mask = p > 0
        div = float(np.sum(p[mask] * np.log(p[mask] / np.maximum(q[mask], 1e-12))))
        if div < best_div:
            best_i, best_div = i, div
    t = best_i * width
    return _with_zero(max(lo0, -t), min(hi0, t))


def spanning(lo: float, hi: float, span: float, symmetric: bool) -> tuple[float, float]:
    """[lo, hi] widened so that its grid spans `span` (a Softmax's input: the gap its result grid
    needs, Planner._softmax_gap). An asymmetric grid is widened by the same amount at both ends
    to `span`. A symmetric grid (every int16 one) is centred on zero whatever the values, so each
    end reaches `span`: only then can one logit rise the whole gap above others near zero (a
    many-class classifier's confident answer), not just above its mirror image (two classes whose
    logits are each other's negative); at 16 bits the step, at most doubled, is 1/32767 of it."""
    if symmetric:
        return min(lo, -span), max(hi, span)
    if hi - lo >= span:
        return lo, hi
    extra = (span - (hi - lo)) / 2
    return _with_zero(lo - extra, hi + extra)


METHOD_FUNCTIONS = {"minmax": minmax, "percentile": percentile_range, "kl": kl, "mse": mse}


def centred(bits: int, symmetric: bool) -> bool:
    """Whether a `bits`-bit grid is symmetric about zero (zero point 0): asked for, or int16."""
    return symmetric or bits == 16


def quant_params(lo: float, hi: float, bits: int, symmetric: bool) -> tuple[float, int]:
    """(scale, zero_point) for a signed `bits`-bit grid over [lo, hi]; a zero range gets scale 1."""
    qmin, qmax = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    lo, hi = _with_zero(lo, hi)
    if centred(bits, symmetric):
        t = max(-lo, hi)
        scale = t / qmax if t > 0 else 1.0
        return float(scale), 0
    if hi - lo <= 0:
        return 1.0, 0
    scale = (hi - lo) / (qmax - qmin)
    zero_point = int(np.clip(round(qmin - lo / scale), qmin, qmax))
    return float(scale), zero_point
