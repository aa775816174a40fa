"""Streaming per-tensor statistics: fixed-size histograms and sums, plus one mean square (8 bytes)
per sample.

The histogram spans [-R, R] with BINS bins; when data falls outside, R doubles and pairs of bins
merge, which is exact. Non-finite values are counted and left out.

Two histograms share those bins: `hist` counts values; `relative_hist` weighs each sample's
values by the inverse of that sample's power (its sum of squares), so a squared error summed over
it is each sample's error relative to its own signal, every sample weighing the same. A faint
image's values sit low in ranges that bright ones set; counted, they are outvoted by the bright
images' large values, weighed, they are not (docs/quantization.md, "Every image weighs the same").
How far the samples' powers spread (`power_spread`: decades between the 10th and the 90th
percentile sample's mean square) says whether that matters for a tensor.
"""

from __future__ import annotations

from array import array

import numpy as np

from npubuild.stages.reductions import dot

BINS = 2048


class TensorStats:
    def __init__(self) -> None:
        self.count = 0
        self.nonfinite = 0
        self.min = np.inf
        self.max = -np.inf
        self.sum = 0.0
        self.sumsq = 0.0
        self.radius = 0.0
        self.hist = np.zeros(BINS, dtype=np.int64)
        self.relative_hist = np.zeros(BINS, dtype=np.float64)
        self.channel_sum: np.ndarray | None = None
        self.channel_absmax: np.ndarray | None = None
        self.channel_count = 0
        self.sample_power = array("d")  # each sample's mean square

    def update(self, x: np.ndarray, channel_axis: int | None = None) -> None:
        x = np.asarray(x, dtype=np.float64)
        finite = np.isfinite(x)
        if not finite.all():
            self.nonfinite += int((~finite).sum())
            if channel_axis is not None:
                x = np.where(finite, x, 0.0)
        values = x[finite] if not finite.all() else x.reshape(-1)
        if channel_axis is not None and x.ndim > channel_axis:
            axes = tuple(i for i in range(x.ndim) if i != channel_axis)
            sums = x.sum(axis=axes)
            self.channel_sum = sums if self.channel_sum is None else self.channel_sum + sums
            peaks = np.abs(x).max(axis=axes) if x.size else np.zeros(x.shape[channel_axis])
            self.channel_absmax = (
                peaks if self.channel_absmax is None else np.maximum(self.channel_absmax, peaks)
            )
            self.channel_count += x.size // x.shape[channel_axis]
        if values.size == 0:
            return
        lo, hi = float(values.min()), float(values.max())
        self.min, self.max = min(self.min, lo), max(self.max, hi)
        self.count += values.size
        self.sum += float(values.sum())
        power = dot(values, values)
        self.sumsq += power
        self.sample_power.append(power / values.size)
        need = max(abs(lo), abs(hi))
        if self.radius == 0.0:
            self.radius = need if need > 0 else 1e-8
        while need > self.radius:
            self.hist = _doubled(self.hist)
            self.relative_hist = _doubled(self.relative_hist)
            self.radius *= 2
        counts, _ = np.histogram(values, bins=BINS, range=(-self.radius, self.radius))
        self.hist += counts
        if power > 0:  # an all-zero sample has no error to weigh: zero is exact
            self.relative_hist += counts / power

    def to_record(self) -> tuple[dict, dict[str, np.ndarray]]:
        mean = self.sum / self.count if self.count else 0.0
        var = max(self.sumsq / self.count - mean * mean, 0.0) if self.count else 0.0
        meta = {
            "count": self.count,
            "nonfinite": self.nonfinite,
            "min": float(self.min) if self.count else 0.0,
            "max": float(self.max) if self.count else 0.0,
            "mean": mean,
            "std": var**0.5,
            "radius": self.radius,
            "power_spread": power_spread(self.sample_power),
        }
        arrays = {"hist": self.hist, "relative_hist": self.relative_hist}
        if self.channel_sum is not None and self.channel_count:
            arrays["channel_mean"] = self.channel_sum / self.channel_count
            arrays["channel_absmax"] = self.channel_absmax
        return meta, arrays


def _doubled(hist: np.ndarray) -> np.ndarray:
    """The same counts over twice the radius: pairs of bins merged into the middle half."""
    wider = np.zeros_like(hist)
    wider[BINS // 4 : BINS // 4 + BINS // 2] = hist.reshape(-1, 2).sum(axis=1)
    return wider


def power_spread(sample_power: array) -> float:
    """Decades between the 10th and the 90th percentile of the samples' mean squares (all-zero
    samples left out: their error is zero whatever the range). 0 when fewer than two remain."""
    powers = np.asarray(sample_power, dtype=np.float64)  # (the buffer protocol: no copy per value)
    powers = powers[powers > 0]
    if powers.size < 2:
        return 0.0
    low, high = np.percentile(np.log10(powers), [10, 90])
    return float(high - low)
