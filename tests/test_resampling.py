"""benchmarks/_resampling.py: the bootstrap and leave-one-out figures ptq_vs_ort.py prints beside
each row's SQNR difference."""

from __future__ import annotations

import sys

import numpy as np

from conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
from _resampling import difference, shares, sqnr  # noqa: E402


def _parts(signal: list[float], error: list[float]) -> np.ndarray:
    return np.array([[signal], [error]], dtype=np.float64)  # [2, 1 output, images]


def test_shares_split_each_image_and_output_and_sum_to_the_rows_figure():
    rng = np.random.default_rng(1)
    reference = [[rng.normal(size=(3, 4)), rng.normal(size=5)] for _ in range(6)]
    candidate = [[r + 0.1 * rng.normal(size=r.shape) for r in ref] for ref in reference]
    parts = shares(reference, candidate)
    assert parts.shape == (2, 2, 6)
    for k in range(2):
        r = np.concatenate([ref[k].ravel() for ref in reference])
        c = np.concatenate([cand[k].ravel() for cand in candidate])
        assert np.isclose(parts[0, k].sum(), r @ r)
        assert np.isclose(parts[1, k].sum(), ((r - c) ** 2).sum())
    whole = np.mean([10 * np.log10(parts[0, k].sum() / parts[1, k].sum()) for k in range(2)])
    assert np.isclose(sqnr(parts, np.ones((1, 6)))[0], whole)


def test_a_lead_on_every_image_holds_on_every_resample():
    signal = [1.0] * 8
    ours = _parts(signal, [1e-3] * 8)
    other = _parts(signal, [2e-3] * 8)
    d = difference(ours, other)
    assert np.isclose(d["all"], 10 * np.log10(2))
    assert d["share"] == 1.0 and d["p5"] > 0
    assert np.isclose(d["least_left_out"], d["most_left_out"])


def test_a_row_one_image_decides_shows_it_in_the_left_out_range():
    # ours is ahead on seven images and far behind on one that carries most of the error
    signal = [1.0] * 8
    ours = _parts(signal, [1e-4] * 7 + [1e-1])
    other = _parts(signal, [1e-3] * 7 + [1e-2])
    d = difference(ours, other)
    assert d["all"] < 0
    assert d["most_left_out"] > 0 > d["least_left_out"]  # without that image ours leads
    assert 0.0 < d["share"] < 1.0 and d["p5"] < 0 < d["p95"]
