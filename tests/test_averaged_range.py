"""A tensor only an average pool reads: its range's rounding noise counts once per mean (it
shrinks N times over the N values averaged), its clipping whole, so the range keeps more of the
tail whose loss would bias the mean (a classifier's global pool before its logits)."""

from __future__ import annotations

import numpy as np
from onnx import helper

from conftest import small_model
from npubuild.stages.quantize import ranges, reader_facts
from npubuild.stages.quantize.graphinfo import GraphInfo
from npubuild.stages.quantize.histogram import TensorStats

WINDOW = 48  # the values one mean takes: a [1, C, 1, 48] feature map under a global average pool


def _channels(rng, n: int) -> np.ndarray:
    """n channels of WINDOW values each; a channel's level sets all of its values, so large
    values come together, as in a feature map."""
    level = rng.lognormal(-1.5, 0.8, size=(n, 1))
    return level * rng.exponential(1.0, size=(n, WINDOW)) - 0.05


def _grid_error_of_means(x: np.ndarray, lo: float, hi: float) -> float:
    scale, zero_point = ranges.quant_params(lo, hi, 8, False)
    dq = (np.clip(np.round(x / scale) + zero_point, -128, 127) - zero_point) * scale
    return float(((dq.mean(axis=1) - x.mean(axis=1)) ** 2).mean())


def test_the_mean_of_an_averaged_range_is_closer():
    rng = np.random.default_rng(22)
    calibration, fresh = _channels(rng, 400), _channels(rng, 4000)
    stats = TensorStats()
    stats.update(calibration.astype(np.float32))
    meta, arrays = stats.to_record()
    plain = ranges.mse_through(meta, arrays["hist"], 8, None)
    averaged = ranges.mse_through(meta, arrays["hist"], 8, None, averaged=WINDOW)
    assert plain[1] < averaged[1] <= 1.01 * meta["max"]  # more of the tail kept
    assert _grid_error_of_means(fresh, *averaged) < 0.95 * _grid_error_of_means(fresh, *plain)


def test_the_values_a_pool_averages_are_counted():
    weights = {"w": np.random.default_rng(23).normal(size=(4, 3, 1, 1))}
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["features"], name="conv"),
        helper.make_node("GlobalAveragePool", ["features"], ["pooled"], name="pool"),
        helper.make_node("Relu", ["x"], ["relu"], name="relu"),
        helper.make_node("AveragePool", ["relu"], ["local"], kernel_shape=[1, 3], name="local_pool"),
    ]
    outputs = {"pooled": [1, 4, 1, 1], "local": [1, 3, 1, 46]}
    model = small_model(nodes, "pools", {"x": [1, 3, 1, WINDOW]}, outputs, weights)
    info = GraphInfo.of(model.graph)
    assert reader_facts.averaged_count(info, "features") == WINDOW  # the global pool's only input
    assert reader_facts.averaged_count(info, "relu") == 3  # the local pool's kernel
    assert reader_facts.averaged_count(info, "x") == 1  # read by the Conv and the Relu
