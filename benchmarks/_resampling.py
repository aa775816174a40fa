"""How far a difference between two quantizers' output SQNR on a few evaluation images can be
trusted: each image's share of each output's signal and error, then the difference recomputed on
resampled sets of the same images (a bootstrap) and with each image left out in turn.

A benchmark's row is the SQNR over all its images, sum(signal) / sum(error) per output, averaged
over the outputs (ptq_vs_ort.accuracy). On a classifier's 16 text lines one uncertain line can
carry most of the error, so the row says as much about that line as about the quantizer; these
figures say how much.
"""

from __future__ import annotations

import numpy as np

ROUNDS = 2000  # bootstrap resamples
SEED = 0  # the same resamples for every row and every run


def shares(reference: list[list[np.ndarray]], candidate: list[list[np.ndarray]]) -> np.ndarray:
    """[2, outputs, images]: each image's signal (sum of the reference's squares) and error (sum
    of squared differences), per output, in float64: the sums evaluate's figures are made of
    (metrics.Agreement.terms)."""
    from npubuild.stages.metrics import Agreement

    out = np.zeros((2, len(reference[0]), len(reference)))
    for i, (ref, cand) in enumerate(zip(reference, candidate)):
        for k, (r, c) in enumerate(zip(ref, cand)):
            terms = Agreement.terms(r, c)
            out[0, k, i], out[1, k, i] = terms[1], terms[3]
    return out


def sqnr(parts: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """SQNR (dB) averaged over outputs, for each row of `weights` ([sets, images]: how often each
    image is in the set)."""
    signal = weights @ parts[0].T  # [sets, outputs]
    error = np.maximum(weights @ parts[1].T, 1e-300)
    return (10 * np.log10(signal / error)).mean(axis=1)


def difference(ours: np.ndarray, other: np.ndarray) -> dict[str, float]:
    """ours - other in dB on all images; its 5th and 95th percentile over bootstrap resamples of
    the images and the share of resamples where ours is at least as good; its least and largest
    value with one image left out."""
    images = ours.shape[2]
    every = np.ones((1, images))
    rng = np.random.default_rng(SEED)
    picks = rng.integers(0, images, size=(ROUNDS, images))
    counts = np.zeros((ROUNDS, images))
    np.add.at(counts, (np.arange(ROUNDS)[:, None], picks), 1.0)
    boot = sqnr(ours, counts) - sqnr(other, counts)
    left_out = 1.0 - np.eye(images)
    jack = sqnr(ours, left_out) - sqnr(other, left_out)
    return {
        "all": float(sqnr(ours, every)[0] - sqnr(other, every)[0]),
        "p5": float(np.percentile(boot, 5)),
        "p95": float(np.percentile(boot, 95)),
        "share": float((boot >= 0).mean()),
        "least_left_out": float(jack.min()),
        "most_left_out": float(jack.max()),
    }
