"""Statistics, range methods and the quantizer on small graphs, with onnxruntime as the judge."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from npubuild.intmodel import tensorfile
from npubuild.rules.attrs import QuantizeConfig
from npubuild.stages import calibrate
from npubuild.stages import evaluate as evaluate_stage
from npubuild.stages.quantize import ranges
from npubuild.stages.quantize import stage as quantize_stage
from npubuild.stages.quantize.histogram import BINS, TensorStats

RNG = np.random.default_rng(5)
# Every key given (the quantizer reads a complete configuration, as QuantizeConfig makes it). These
# tests pin the graph rules they test, so the later defaults that change other tensors' grids
# (per-channel depthwise inputs, 16-bit absorbed and squared tensors, shared Concat grids, the
# measured bias correction) are off here, and their own tests switch them on.
SETTINGS = QuantizeConfig(
    empirical_bias=False,
    square_bits=8,
    depthwise_inputs="tensor",
    absorbed_bits=8,
    concat_grids="own",
).model_dump() | {"overrides": []}


def test_histogram_widening_is_exact():
    stats = TensorStats()
    chunks = [RNG.normal(size=500) * s for s in (0.1, 1.0, 30.0, 2.0)]
    for c in chunks:
        stats.update(c)
    meta, arrays = stats.to_record()
    data = np.concatenate(chunks)
    expected, _ = np.histogram(data, bins=BINS, range=(-meta["radius"], meta["radius"]))
    # merged bins line up with a fresh histogram over the final range, up to values on bin edges
    assert arrays["hist"].sum() == data.size == meta["count"]
    assert np.abs(arrays["hist"] - expected).sum() <= 4
    assert meta["min"] == data.min() and meta["max"] == data.max()
    assert abs(meta["std"] - data.std()) < 1e-9 * max(1, data.std())


def test_nonfinite_values_are_counted_and_left_out():
    stats = TensorStats()
    stats.update(np.array([1.0, np.nan, -2.0, np.inf, -np.inf, 0.5]))
    meta, arrays = stats.to_record()
    assert meta["nonfinite"] == 3 and meta["count"] == 3
    assert (meta["min"], meta["max"]) == (-2.0, 1.0)
    assert arrays["hist"].sum() == 3


@pytest.mark.parametrize("method", ["minmax", "percentile", "kl", "mse"])
def test_every_method_gives_a_range_containing_zero_within_the_data(method):
    stats = TensorStats()
    data = np.concatenate([RNG.normal(size=20000), [40.0]])  # one outlier
    stats.update(data)
    meta, arrays = stats.to_record()
    lo, hi = ranges.METHOD_FUNCTIONS[method](meta, arrays["hist"], 8, False, 99.9)
    assert meta["min"] <= lo <= 0 <= hi <= meta["max"]
    if method != "minmax":
        assert hi < 40.0  # the outlier is clipped


def _measured_error(data: np.ndarray, lo: float, hi: float, fn) -> float:
    """Mean squared error of fn over data quantized to the int8 grid of [lo, hi], measured."""
    scale, zp = ranges.quant_params(lo, hi, 8, False)
    dq = (np.clip(np.round(data / scale) + zp, -128, 127) - zp) * scale
    return float(np.mean((fn(data) - fn(dq)) ** 2))


def test_a_range_read_by_an_activation_is_chosen_by_the_error_after_it():
    from npubuild.intmodel.lut import lut_function

    hardswish = lut_function("HardSwish", {})
    rng = np.random.default_rng(11)  # its own: the module's RNG feeds the tests after it
    data = (rng.normal(size=50000) * 4).astype(np.float32)  # much of it below -3, where HardSwish is 0
    stats = TensorStats()
    stats.update(data)
    meta, arrays = stats.to_record()
    shared = ranges.mse(meta, arrays["hist"], 8, False, 99.99)
    through = ranges.mse_through(meta, arrays["hist"], 8, hardswish)
    assert -3.5 < through[0] < -2.5 and shared[0] < -6  # clipped where the function is flat
    assert _measured_error(data, *through, hardswish) < 0.5 * _measured_error(data, *shared, hardswish)


def test_independent_ends_fit_a_skewed_tensor_better_than_one_shrink_factor():
    identity = lambda v: v  # noqa: E731
    rng = np.random.default_rng(12)
    data = np.concatenate([rng.exponential(2.0, size=40000), -rng.exponential(0.05, size=10000)])
    stats = TensorStats()
    stats.update(data)
    meta, arrays = stats.to_record()
    shared = ranges.mse(meta, arrays["hist"], 8, False, 99.99)
    independent = ranges.mse_through(meta, arrays["hist"], 8, None)
    assert meta["min"] <= independent[0] <= 0 <= independent[1] <= meta["max"]
    assert _measured_error(data, *independent, identity) < _measured_error(data, *shared, identity)


def test_an_asymmetric_range_is_the_grid_it_becomes():
    """The zero point is an integer: a lower end within half a step of zero becomes zero, and a
    search that judged the range it asked for (not the grid it got) clipped every negative value
    of YOLOv8n's second SiLU (range [-0.278, 171]): a bias every later layer sums, 3 dB of the
    network's output SQNR. The returned ends are the grid's own, and the measured error of that
    grid is as small as a search over grids on the data itself finds."""
    rng = np.random.default_rng(13)  # its own: the module's RNG feeds the tests after it
    x = np.concatenate([rng.normal(0, 1.5, size=60000), rng.exponential(25.0, size=600)])
    data = x / (1 + np.exp(-x))  # SiLU: [-0.278, ~150], a step of ~0.55 at int8
    stats = TensorStats()
    stats.update(data)
    meta, arrays = stats.to_record()
    lo, hi = ranges.mse_through(meta, arrays["hist"], 8, None)
    scale, zp = ranges.quant_params(lo, hi, 8, False)
    assert (-128 - zp) * scale == pytest.approx(lo, rel=1e-9)
    assert (127 - zp) * scale == pytest.approx(hi, rel=1e-9)
    assert zp > -128  # a negative step: SiLU's negative values are not all clipped to zero
    identity = lambda v: v  # noqa: E731
    best = min(
        _measured_error(data, -a, b, identity)
        for a in np.linspace(0.0, 0.6, 13)
        for b in np.linspace(0.5, 1.0, 51) * meta["max"]
    )
    assert _measured_error(data, lo, hi, identity) < 1.05 * best


def test_every_sample_weighs_the_same_in_the_relative_histogram():
    """A faint sample (a low-contrast photograph) and bright ones with a long tail (dense
    printed text): counted, the bright samples' large values set the range and the faint one's
    values get a handful of steps; weighed by each sample's power, the range minimises the mean
    over samples of their noise-to-signal ratio, which the faint sample's dominated."""
    rng = np.random.default_rng(14)  # its own: the module's RNG feeds the tests after it
    faint = np.abs(rng.normal(0, 0.3, size=20000))
    bright = [np.abs(rng.standard_t(3, size=20000)) * 4 for _ in range(3)]
    samples = [faint, *bright]
    stats = TensorStats()
    for sample in samples:
        stats.update(sample)
    meta, arrays = stats.to_record()
    # each sample's weights add up to its count over its power, through the histogram's widening
    expected = sum(s.size / float(s @ s) for s in samples)
    assert arrays["relative_hist"].sum() == pytest.approx(expected, rel=1e-12)
    pooled = ranges.mse_through(meta, arrays["hist"], 8, None)
    relative = ranges.mse_through(meta, arrays["relative_hist"], 8, None)
    identity = lambda v: v  # noqa: E731

    def noise_to_signal(sample, lo, hi):
        return _measured_error(sample, lo, hi, identity) / np.mean(sample**2)

    assert relative[1] < pooled[1]
    assert noise_to_signal(faint, *relative) < 0.5 * noise_to_signal(faint, *pooled)
    mean_ratio = {r: np.mean([noise_to_signal(s, *r) for s in samples]) for r in (pooled, relative)}
    assert mean_ratio[relative] < 0.5 * mean_ratio[pooled]


def test_zero_range_and_one_sided_ranges_give_valid_parameters():
    assert ranges.quant_params(0.0, 0.0, 8, False) == (1.0, 0)
    scale, zp = ranges.quant_params(0.0, 6.0, 8, False)
    assert zp == -128 and scale == pytest.approx(6 / 255)
    scale, zp = ranges.quant_params(-1.0, 3.0, 16, False)
    assert zp == 0 and scale == pytest.approx(3 / 32767)


def small_model(with_log: bool = False) -> onnx.ModelProto:
    w1 = RNG.normal(size=(4, 3, 3, 3)).astype(np.float32) * 0.3
    w2 = RNG.normal(size=(6, 4, 1, 1)).astype(np.float32) * 0.3
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], name="conv2"),
        helper.make_node("Sigmoid", ["c2"], ["s2"], name="sig"),
        helper.make_node("Mul", ["c2", "s2"], ["m2"], name="mul"),
        helper.make_node("Add", ["m2", "bias"], ["a2"], name="add"),
        helper.make_node("GlobalAveragePool", ["a2"], ["g"], name="gap"),
    ]
    if with_log:
        nodes.append(helper.make_node("Log", ["g"], ["y"], name="log"))
    else:
        nodes.append(helper.make_node("Flatten", ["g"], ["y"], name="flat"))
    inits = [
        numpy_helper.from_array(v, k)
        for k, v in {
            "w1": w1,
            "b1": RNG.normal(size=4).astype(np.float32),
            "w2": w2,
            "b2": RNG.normal(size=6).astype(np.float32),
            "bias": np.float32(RNG.normal(size=(1, 6, 1, 1))),
        }.items()
    ]
    out_shape = [1, 6, 1, 1] if with_log else [1, 6]
    graph = helper.make_graph(
        nodes,
        "small",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return onnx.shape_inference.infer_shapes(model)


def pipeline(tmp_path, model, settings=SETTINGS, samples=None, evaluation=None):
    """calibrate, quantize and evaluate; evaluated on the calibration samples unless `evaluation`."""
    model_path = tmp_path / "m.onnx"
    onnx.save(model, model_path)
    data = samples if samples is not None else RNG.normal(size=(8, 3, 8, 8)).astype(np.float32)
    np.save(tmp_path / "x.npy", data)
    np.save(tmp_path / "e.npy", data if evaluation is None else evaluation)
    (tmp_path / "cal").mkdir(exist_ok=True)
    (tmp_path / "q").mkdir(exist_ok=True)
    (tmp_path / "e").mkdir(exist_ok=True)
    cal = calibrate.run({}, {"model": model_path, "calibration": tmp_path / "x.npy"}, tmp_path / "cal")
    q = quantize_stage.run(settings, {"model": model_path, "stats": cal["stats"]}, tmp_path / "q")
    e = evaluate_stage.run(
        {"samples": 8},
        {
            "model": model_path,
            "integer": q["integer"],
            "qdq": q["qdq"],
            "evaluation": tmp_path / "e.npy",
            "stats": cal["stats"],
        },
        tmp_path / "e",
    )
    import json

    return cal, q, json.loads(e["report"].read_text()), json.loads(q["summary"].read_text())


def test_small_model_end_to_end(tmp_path):
    _, q, report, summary = pipeline(tmp_path, small_model())
    (out,) = report["outputs"].values()
    assert out["cosine"] > 0.995
    g = report["golden_vs_qdq"]["op_by_op"]
    assert g["within_1_lsb"] >= 0.999 and g["elements"] > 500
    assert summary["float_ops"] == 0
    assert set(summary["op_kinds"]) >= {"conv", "mul", "add", "lut", "global_avgpool", "move"}
    # the ReLU was fused into conv1: its clamp is in the conv, there is no clamp op
    assert "clamp" not in summary["op_kinds"]


def test_power_spread_counts_decades_between_the_tenth_and_ninetieth_percentile_sample():
    stats = TensorStats()
    for scale in (1.0,) * 5 + (10.0,) * 5:  # mean squares 1 and 100: two decades apart
        stats.update(np.full(64, scale) * np.where(np.arange(64) % 2, 1.0, -1.0))
    stats.update(np.zeros(64))  # an all-zero sample has no error to weigh: left out
    meta, _ = stats.to_record()
    assert meta["power_spread"] == pytest.approx(2.0)
    same = TensorStats()
    for seed in range(6):
        same.update(np.random.default_rng(seed).normal(size=4096))
    assert same.to_record()[0]["power_spread"] < 0.05


def test_relative_range_error_serves_the_faint_images_of_a_mixed_calibration_set(tmp_path):
    """`range_error = "relative"` reaches the ranges: calibrated on bright samples and a few
    faint ones, the integer model is more accurate on faint images than with pooled errors.
    "spread" (the default) takes relative where the samples' powers spread over more than
    `spread_decades` (here every tensor: about four decades), pooled where they do not."""
    rng = np.random.default_rng(15)  # its own: the module's RNG feeds the tests after it
    weights = [rng.normal(size=shape).astype(np.float32) * 0.3 for shape in ((4, 3, 3, 3), (6, 4, 1, 1))]
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
            helper.make_node("Relu", ["c1"], ["r1"]),
            helper.make_node("Conv", ["r1", "w2"], ["y"]),
        ],
        "no_biases",  # a bias would give faint and bright inputs the same power after it
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 6, 8, 8])],
        [numpy_helper.from_array(w, n) for w, n in zip(weights, ("w1", "w2"))],
    )
    model = onnx.shape_inference.infer_shapes(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    )
    bright = rng.standard_t(3, size=(6, 3, 8, 8)).astype(np.float32) * 3
    faint = rng.normal(size=(2, 3, 8, 8)).astype(np.float32) * 0.05
    unseen_faint = rng.normal(size=(8, 3, 8, 8)).astype(np.float32) * 0.05
    calibration = np.concatenate([bright, faint])
    sqnr = {}
    choices = {
        "pooled": {"range_error": "pooled"},
        "relative": {"range_error": "relative"},
        "spread": {},
        "spread over 10 decades": {"range_error": "spread", "spread_decades": 10.0},
    }
    for k, (choice, settings) in enumerate(choices.items()):
        (tmp_path / str(k)).mkdir()
        cal, _, report, _ = pipeline(
            tmp_path / str(k), model, {**SETTINGS, **settings}, samples=calibration, evaluation=unseen_faint
        )
        (out,) = report["outputs"].values()
        sqnr[choice] = out["sqnr_db"]
    spreads = {name: t["power_spread"] for name, t in tensorfile.load(cal["stats"])[1]["tensors"].items()}
    assert min(spreads.values()) > 3, spreads
    assert sqnr["relative"] > sqnr["pooled"] + 3, sqnr
    assert sqnr["spread"] == sqnr["relative"] and sqnr["spread over 10 decades"] == sqnr["pooled"], sqnr


def test_int16_activations_are_more_accurate(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    _, _, report8, _ = pipeline(tmp_path / "a", small_model())
    _, _, report16, summary = pipeline(tmp_path / "b", small_model(), {**SETTINGS, "activation_bits": 16})
    (o8,), (o16,) = report8["outputs"].values(), report16["outputs"].values()
    # the weights stay int8, so the gain is bounded by their error: 17.4, 23.5 and 28.0 dB measured
    # in three orders of the module's random draws (which depend on the tests run before this one)
    assert o16["sqnr_db"] > o8["sqnr_db"] + 10
    assert set(summary["tensor_bits"]) == {"16"}
    assert report16["golden_vs_qdq"]["op_by_op"]["within_1_lsb"] >= 0.999


def test_nan_and_inf_activations_give_valid_parameters(tmp_path):
    # Log of averages that can be <= 0 gives NaN and -Inf during calibration.
    cal, q, report, summary = pipeline(tmp_path, small_model(with_log=True))
    arrays, meta = tensorfile.load(cal["stats"])
    assert meta["tensors"]["y"]["nonfinite"] > 0
    program_arrays, program = tensorfile.load(q["integer"])
    assert all(np.isfinite(t["scale"]) and t["scale"] > 0 for t in program["tensors"].values())
    # the Log is a lookup table: codes outside its domain (log of <= 0) map to the nearest valid
    # code instead of NaN
    (log,) = [op for op in program["ops"] if op.get("op_type") == "Log"]
    assert log["kind"] == "lut"
    table = program_arrays[log["arrays"]["table"]]
    bits = program["tensors"][log["outputs"][0]]["bits"]  # (an output's tail: output_bits)
    assert table.min() == -(2 ** (bits - 1)) and table.max() < 2 ** (bits - 1)


def test_constant_tensor_gets_a_valid_scale(tmp_path):
    model = small_model()
    samples = np.zeros((4, 3, 8, 8), np.float32)  # every activation before the bias is constant
    _, q, report, _ = pipeline(tmp_path, model, samples=samples)
    _, program = tensorfile.load(q["integer"])
    assert program["tensors"]["x"]["scale"] == 1.0 and program["tensors"]["x"]["zero_point"] == 0
    assert all(np.isfinite(v["cosine"]) for v in report["outputs"].values())


def test_overrides_by_name_and_type_and_a_pattern_that_matches_nothing(tmp_path):
    settings = {
        **SETTINGS,
        "overrides": [
            {"match": "conv*", "op_type": None, "bits": 16, "method": None, "keep_float": False},
            {"match": None, "op_type": "GlobalAveragePool", "bits": None, "method": None, "keep_float": True},
            {"match": "nothing_*", "op_type": None, "bits": None, "method": None, "keep_float": True},
        ],
    }
    _, q, _, summary = pipeline(tmp_path, small_model(), settings)
    _, program = tensorfile.load(q["integer"])
    assert program["tensors"]["r1"]["bits"] == 16 and program["tensors"]["c2"]["bits"] == 16
    assert [f["node"] for f in summary["float_nodes"]] == ["gap"]
    assert any("'nothing_*'" in w and "matches no node" in w for w in summary["warnings"])


def test_quantize_is_deterministic(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    samples = RNG.normal(size=(4, 3, 8, 8)).astype(np.float32)
    model = small_model()
    _, qa, _, _ = pipeline(tmp_path / "a", model, samples=samples)
    _, qb, _, _ = pipeline(tmp_path / "b", model, samples=samples)
    assert qa["integer"].read_bytes() == qb["integer"].read_bytes()
    assert qa["qdq"].read_bytes() == qb["qdq"].read_bytes()


@pytest.mark.parametrize("include_pad, ceil", [(0, 0), (0, 1), (1, 0), (1, 1)])
def test_average_pool_border_counts_match_onnxruntime(tmp_path, include_pad, ceil):
    w = RNG.normal(size=(4, 3, 3, 3)).astype(np.float32) * 0.3
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
        helper.make_node(
            "AveragePool",
            ["c"],
            ["y"],
            kernel_shape=[3, 3],
            strides=[2, 2],
            pads=[1, 1, 1, 1],
            count_include_pad=include_pad,
            ceil_mode=ceil,
            name="pool",
        ),
    ]
    graph = helper.make_graph(
        nodes,
        "pool",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    _, _, report, summary = pipeline(tmp_path, onnx.shape_inference.infer_shapes(model))
    assert "avgpool" in summary["op_kinds"] and summary["float_ops"] == 0
    by_kind = report["golden_vs_qdq"]["op_by_op"]["by_kind"]
    assert by_kind["avgpool"]["within_1_lsb"] == 1.0
    (out,) = report["outputs"].values()
    assert out["cosine"] > 0.995


def test_int16_layers_keep_large_biases_exact(tmp_path):
    # A bias of 300 at in_scale * w_scale ~ 1e-8 would overflow int32: int16 layers use int64.
    w = RNG.normal(size=(2, 3, 1, 1)).astype(np.float32) * 0.1
    b = np.array([300.0, -250.0], np.float32)
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w", "b"], ["y"], name="conv")],
        "bias",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 4, 4])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    samples = (RNG.normal(size=(4, 3, 4, 4)) * 0.01).astype(np.float32)
    _, q, report, _ = pipeline(tmp_path, model, {**SETTINGS, "activation_bits": 16}, samples=samples)
    arrays, program = tensorfile.load(q["integer"])
    (conv,) = [op for op in program["ops"] if op["kind"] == "conv"]
    assert np.abs(arrays[conv["arrays"]["bias"]]).max() > 2**31
    (out,) = report["outputs"].values()
    assert out["sqnr_db"] > 60
    assert report["golden_vs_qdq"]["op_by_op"]["within_1_lsb"] == 1.0


def test_evaluate_report_does_not_depend_on_the_sample_threads(tmp_path, monkeypatch):
    """Samples run in threads; every sum takes them in sample order, so one thread and three give
    the same bytes (and the threads do run: each sample is measured on a different thread)."""
    import threading

    from npubuild.stages import parallel

    samples = RNG.normal(size=(7, 3, 8, 8)).astype(np.float32) * 3
    model = small_model()
    reports, threads = [], set()
    original = parallel.in_order

    def spying(work, items, workers):
        def traced(item):
            threads.add(threading.get_ident())
            return work(item)

        return original(traced, items, workers)

    monkeypatch.setattr("npubuild.stages.evaluate.in_order", spying)
    for count in ("1", "3"):
        monkeypatch.setenv("NPUBUILD_SAMPLE_THREADS", count)
        (tmp_path / count).mkdir()
        pipeline(tmp_path / count, model, samples=samples)
        reports.append((tmp_path / count / "e" / "accuracy.json").read_bytes())
    assert reports[0] == reports[1]
    assert len(threads) >= 2


def test_in_order_yields_in_item_order_whatever_finishes_first():
    import time

    from npubuild.stages.parallel import in_order

    def slow_first(i: int) -> int:
        time.sleep(0.05 if i % 3 == 0 else 0.0)
        return i * i

    assert list(in_order(slow_first, range(10), 3)) == [i * i for i in range(10)]


def test_an_int8_only_probe_measures_int8_tables_as_the_full_one_and_refuses_int16(tmp_path):
    """The sensitivity pass's probe leaves out the int16 pairs when the settings plan none: the
    same metrics for every int8/float table, and a table that needs int16 is an error, not a
    silently wrong measurement."""
    from npubuild.stages.feeds import iterate_feeds
    from npubuild.stages.quantize.probe import PrecisionProbe

    model = small_model()
    cal, _, _, _ = pipeline(tmp_path, model)
    arrays, stats = tensorfile.load(cal["stats"])
    samples = RNG.normal(size=(5, 3, 8, 8)).astype(np.float32)
    feeds = list(iterate_feeds(model, samples, 5))
    settings = {**SETTINGS, "overrides": [], "preactivation_bits": 8, "output_bits": 8}
    assert PrecisionProbe.planned_widths(model, stats["tensors"], arrays, settings) == (8,)
    assert PrecisionProbe.planned_widths(model, stats["tensors"], arrays, SETTINGS) == (8, 16)
    full = PrecisionProbe(model, stats["tensors"], arrays, settings, feeds)
    narrow = PrecisionProbe(model, stats["tensors"], arrays, settings, feeds, (8,))
    units = full.layers.units
    assert len(narrow.switchable.graph.node) < len(full.switchable.graph.node)
    all_float = {u: "float" for u in units}
    tables = [{}, {units[0]: "float"}, all_float, {**all_float, units[1]: "int8"}]
    for table in tables:
        assert narrow.run(table) == full.run(table)
    assert full.run({units[0]: "int16"}) != full.run({})
    with pytest.raises(ValueError, match="widths"):
        narrow.run({units[0]: "int16"})


def test_a_photo_input_spans_what_its_preprocessing_can_give_not_what_calibration_saw(tmp_path):
    """Calibration photos darker than the evaluation ones: with the preprocessing's range the
    input grid covers the bright pixels, which calibration's own range would clip."""
    from npubuild.intmodel.codes import dequantize, quantize_float
    from npubuild.intmodel.program import TensorQuant
    from npubuild.rules.attrs import Preprocess

    rng = np.random.default_rng(11)
    weight = numpy_helper.from_array(rng.normal(size=(4, 3, 1, 1)).astype(np.float32), "w")
    conv = helper.make_node("Conv", ["x", "w"], ["y"])
    graph = helper.make_graph(
        [conv],
        "conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])],
        [weight],
    )
    model_path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), model_path)
    np.save(tmp_path / "dark.npy", rng.uniform(0, 0.4, size=(8, 3, 8, 8)).astype(np.float32))
    np.save(tmp_path / "bright.npy", rng.uniform(0, 1, size=(8, 3, 8, 8)).astype(np.float32))
    (tmp_path / "cal").mkdir()
    cal = calibrate.run({}, {"model": model_path, "calibration": tmp_path / "dark.npy"}, tmp_path / "cal")
    value_range = Preprocess(scale=1 / 255).value_range()
    assert value_range == (0.0, 1.0)
    sqnr = {}
    for name, settings in [("calibrated", SETTINGS), ("declared", {**SETTINGS, "input_range": value_range})]:
        (tmp_path / name / "q").mkdir(parents=True)
        q = quantize_stage.run(settings, {"model": model_path, "stats": cal["stats"]}, tmp_path / name / "q")
        _, meta = tensorfile.load(q["integer"])
        grid = meta["tensors"]["x"]
        top = (127 - grid["zero_point"]) * grid["scale"]
        # what the integer model's input holds of the bright photos
        bright = np.load(tmp_path / "bright.npy")
        held = dequantize(quantize_float(bright, TensorQuant(**grid)), TensorQuant(**grid))
        sqnr[name] = 10 * np.log10(np.sum(bright**2) / np.sum((bright - held) ** 2))
        if name == "declared":
            assert grid["scale"] == pytest.approx(1 / 255) and top == pytest.approx(1.0, abs=1e-6)
        else:
            assert top < 0.45  # calibration saw nothing brighter than 0.4
    assert sqnr["declared"] > 40 and sqnr["calibrated"] < 10, sqnr


def test_value_range_of_mean_std_preprocessing():
    from npubuild.rules.attrs import Preprocess

    pp = Preprocess(scale=1 / 255, mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])
    lo, hi = pp.value_range()
    assert lo == pytest.approx(-0.485 / 0.229) and hi == pytest.approx((1 - 0.406) / 0.225)
    assert Preprocess(mean=[0.5], std=[0.5]).value_range() == pytest.approx((-1.0, 1.0))
    assert Preprocess(dtype="uint8").value_range() is None


def _conv_output(weight, bias, x, op_type, group, strides):
    """onnxruntime's output of one Conv or ConvTranspose with these float weights."""
    import onnxruntime as ort

    w = numpy_helper.from_array(weight.astype(np.float32), "w")
    b = numpy_helper.from_array(bias.astype(np.float32), "b")
    kernel = list(weight.shape[2:])
    pads = [(k - s) // 2 for k, s in zip(kernel, strides)] * 2 if op_type == "ConvTranspose" else [1, 1, 1, 1]
    node = helper.make_node(op_type, ["x", "w", "b"], ["y"], group=group, strides=strides, pads=pads)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w, b],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x.astype(np.float32)})[0].astype(np.float64)


@pytest.mark.parametrize(
    "op_type, group, strides",
    [("Conv", 1, [1, 1]), ("Conv", 2, [2, 2]), ("ConvTranspose", 1, [2, 2]), ("ConvTranspose", 2, [2, 2])],
)
def test_the_analytic_correction_removes_the_weight_rounding_mean(op_type, group, strides):
    """Inputs with large per-channel means: the int8 weights' rounding shifts each output
    channel's mean; the corrected bias takes that shift back out, for a transposed convolution
    too, whose output mean is the taps' sum divided by the stride's area."""
    from npubuild.stages.quantize.weights import bias_correction, grouped_transpose_scales, quantize_weight

    rng = np.random.default_rng(11)
    cin, cout, k = 8, 6, 4 if op_type == "ConvTranspose" else 3
    shape = (cin, cout // group, k, k) if op_type == "ConvTranspose" else (cout, cin // group, k, k)
    w = rng.normal(size=shape) * 0.3
    means = rng.uniform(2.0, 6.0, size=cin)
    x = means[None, :, None, None] + 0.1 * rng.normal(size=(1, cin, 48, 48))
    if op_type == "ConvTranspose":
        wq, scale = quantize_weight(w, 1, True) if group == 1 else grouped_transpose_scales(w, group)
        per = wq.astype(np.float64).reshape(group, cin // group, cout // group, k, k)
        dequantized = (per * scale.reshape(group, 1, -1, 1, 1)).reshape(w.shape)
    else:
        wq, scale = quantize_weight(w, 0, True)
        dequantized = wq * scale.reshape(-1, 1, 1, 1)
    bias = rng.normal(size=cout)
    float_mean = _conv_output(w, bias, x, op_type, group, strides).mean(axis=(0, 2, 3))
    plain = _conv_output(dequantized, bias, x, op_type, group, strides).mean(axis=(0, 2, 3))
    corrected_bias = bias_correction(means, w, wq, scale, bias, group, op_type == "ConvTranspose", strides)
    corrected = _conv_output(dequantized, corrected_bias, x, op_type, group, strides).mean(axis=(0, 2, 3))
    before, after = np.abs(plain - float_mean), np.abs(corrected - float_mean)
    assert before.max() > 0.01  # the rounding does shift the means
    assert after.max() < 0.15 * before.max()


def test_evaluation_images_beyond_the_calibration_ranges_are_reported(tmp_path):
    """Evaluated on its own calibration samples, no tensor leaves its calibration range; on
    samples three times as large, most do, and the build warns."""
    (tmp_path / "same").mkdir()
    (tmp_path / "louder").mkdir()
    data = RNG.normal(size=(8, 3, 8, 8)).astype(np.float32)
    _, _, same, _ = pipeline(tmp_path / "same", small_model(), samples=data)
    _, _, louder, _ = pipeline(tmp_path / "louder", small_model(), samples=data, evaluation=3 * data)
    assert same["calibration_coverage"]["beyond"] == 0 and same["calibration_coverage"]["tensors"] >= 5
    assert not any("calibration range" in w for w in same["warnings"])
    coverage = louder["calibration_coverage"]
    assert coverage["beyond"] > 0.5 * coverage["tensors"]
    assert coverage["worst"][0]["excess"] >= coverage["worst"][-1]["excess"] > 0.25
    assert any("beyond their calibration range" in w for w in louder["warnings"])


def test_a_layer_that_lost_its_accuracy_to_clipping_is_named_by_what_clipping_alone_leaves(tmp_path):
    """x -> Relu -> 1x1 Conv with min-max ranges: no calibration value lies past its grid, so
    evaluated on the same samples no layer clips. On samples three times as large the Relu's
    values run past its grid's end in every sample, and clipping is most of its error: the SQNR
    clipping alone leaves is within 3 dB of the layer's, never much below it. `npubuild report`'s
    rule names that layer."""
    from conftest import small_model as hand_made
    from npubuild.stages.metrics import clipped_layers, clipping_explains

    model = hand_made(
        [
            helper.make_node("Relu", ["x"], ["r"], name="relu"),
            helper.make_node("Conv", ["r", "w"], ["y"], name="mix"),
        ],
        "clipped",
        {"x": [1, 3, 8, 8]},
        {"y": [1, 4, 8, 8]},
        {"w": RNG.normal(size=(4, 3, 1, 1)) * 0.5},
    )
    (tmp_path / "same").mkdir()
    (tmp_path / "louder").mkdir()
    data = RNG.normal(size=(8, 3, 8, 8)).astype(np.float32)
    minmax = {**SETTINGS, "method": "minmax"}
    _, _, same, _ = pipeline(tmp_path / "same", model, minmax, samples=data)
    _, _, louder, _ = pipeline(tmp_path / "louder", model, minmax, samples=data, evaluation=3 * data)
    assert [r["tensor"] for r in same["layers"]] == ["r", "y"]
    assert all(r["clipped_samples"] == 0 and "clipping_sqnr_db" not in r for r in same["layers"])
    assert clipped_layers(same["layers"]) == []
    relu = louder["layers"][0]
    assert relu["clipped_samples"] == 8 and 0.01 < relu["clipped_values"] < 0.5
    # a clipped value's error is its distance past the end (the code saturates there)
    assert relu["sqnr_db"] - 0.5 <= relu["clipping_sqnr_db"] <= relu["sqnr_db"] + 3.02
    assert clipping_explains(relu) and clipped_layers(louder["layers"])[0]["tensor"] == "r"
    # both reports say it, with the figures
    from rich.console import Console

    from npubuild.html_report import render
    from npubuild.report import render_accuracy

    console = Console(record=True, width=200)
    render_accuracy(console, "//m:relu_mix", louder)
    text = console.export_text()
    assert (
        f"clipped: relu at {relu['sqnr_db']:.2f} dB; clipping alone would leave "
        f"{relu['clipping_sqnr_db']:.2f}" in text
    )
    assert "in 8 of 8 samples" in text
    page = render("//m:relu_mix", [], {"evaluate": louder})
    assert f"<tr><td>relu</td><td>{relu['sqnr_db']:.2f}</td><td>{relu['clipping_sqnr_db']:.2f}</td>" in page
    console = Console(record=True, width=200)
    render_accuracy(console, "//m:relu_mix", same)
    assert "clipped:" not in console.export_text()


def test_clipping_counts_values_past_half_a_step_beyond_the_ends():
    from npubuild.stages.metrics import Agreement, Clipping, clipping_explains

    ref = np.array([[0.0, 1.0, 1.04, 1.5], [-1.2, 0.3, 0.2, 3.0]])
    # grid [-1, 1] step 0.1: 1.04 rounds to the end; 1.5, -1.2 and 3.0 are clipped
    err2, values = Clipping.terms(ref, -1.0, 1.0, 0.1)
    assert values == 3 and np.isclose(err2, 0.5**2 + 0.2**2 + 2.0**2)
    # per channel (axis 1 of [1, 2, 2]): channel 0 [1.04, 1.5] on [-1, 1] clips 1.5; channel 1
    # [0.2, 3.0] on [-4, 4] clips nothing
    err2, values = Clipping.terms(
        ref.reshape(1, 2, 4)[:, :, 2:],
        np.array([-1.0, -4.0]).reshape(1, 2, 1),
        np.array([1.0, 4.0]).reshape(1, 2, 1),
        0.1,
    )
    assert values == 1 and np.isclose(err2, 0.5**2)
    agreement, clipping = Agreement(), Clipping()
    agreement.update(ref, np.clip(ref, -1.0, 1.0))
    clipping.add(Clipping.terms(ref, -1.0, 1.0, 0.1))
    clipping.add(Clipping.terms(np.zeros(4), -1.0, 1.0, 0.1))
    row = {"tensor": "t", **agreement.result(), **clipping.result(agreement)}
    assert row["clipped_samples"] == 1 and row["clipped_values"] == round(3 / 8, 7)
    assert clipping_explains(row)
    assert not clipping_explains({**row, "read_through": "Sigmoid"})  # clipped where it is flat
    assert not clipping_explains({**row, "op_type": "Reshape"})  # its input's values, named there
    assert not clipping_explains({**row, "sqnr_db": row["clipping_sqnr_db"] - 3.1})  # mostly rounding


def test_a_pre_activation_is_judged_after_its_activation(tmp_path):
    """x -> 1x1 Conv -> HardSwish -> 1x1 Conv, min-max ranges, evaluated three times beyond them:
    the convolution's result (read by the HardSwish alone) is clipped at its top, where HardSwish
    is the identity, so the clipping shows after the function too and is named against the
    HardSwish's own result. Clipping past the flat end of a function costs nothing after it."""
    from conftest import small_model as hand_made
    from npubuild.intmodel.lut import lut_function
    from npubuild.stages.metrics import Clipping, clipped_layers, clipping_explains, clipping_figures

    sigmoid = lut_function("Sigmoid", {})
    err2, values = Clipping.terms(np.array([-40.0, -30.0, 0.5]), -20.0, 20.0, 0.1, sigmoid)
    assert values == 2 and err2 < 1e-16  # past the flat end: clipped, and free after the Sigmoid
    err2, values = Clipping.terms(np.array([6.0, 1.0]), -4.0, 4.0, 0.1, lut_function("HardSwish", {}))
    assert values == 1 and np.isclose(err2, 2.0**2)  # the identity above 3: all of it
    model = hand_made(
        [
            helper.make_node("Conv", ["x", "w1"], ["c"], name="widen"),
            helper.make_node("HardSwish", ["c"], ["h"], name="act"),
            helper.make_node("Conv", ["h", "w2"], ["y"], name="mix"),
        ],
        "through",
        {"x": [1, 3, 8, 8]},
        {"y": [1, 4, 8, 8]},
        {"w1": RNG.normal(size=(4, 3, 1, 1)), "w2": RNG.normal(size=(4, 4, 1, 1)) * 0.5},
    )
    data = RNG.normal(size=(8, 3, 8, 8)).astype(np.float32)
    minmax = {**SETTINGS, "method": "minmax"}
    _, _, report, _ = pipeline(tmp_path, model, minmax, samples=data, evaluation=3 * data)
    rows = {r["tensor"]: r for r in report["layers"]}
    pre, act = rows["c"], rows["h"]
    assert pre["read_through"] == "HardSwish" and "clipping_sqnr_db" not in pre
    assert pre["clipped_samples"] == 8 and pre["activation_sqnr_db"] == act["sqnr_db"]
    alone, against = clipping_figures(pre)
    assert against == act["sqnr_db"] and alone <= act["sqnr_db"] + 3.02
    assert clipping_explains(pre) and "c" in [r["tensor"] for r in clipped_layers(report["layers"])]


def test_a_tensor_only_a_table_activation_reads_is_not_blamed_for_its_clipping():
    sigmoid = helper.make_node("Sigmoid", ["t"], ["s"])
    mul, relu = helper.make_node("Mul", ["t", "s"], ["m"]), helper.make_node("Relu", ["t"], ["r"])
    assert evaluate_stage.read_through([sigmoid], False) == {"read_through": "Sigmoid"}
    assert evaluate_stage.read_through([sigmoid, mul], False) == {}  # the Mul reads every value
    assert evaluate_stage.read_through([relu], False) == {}
    assert evaluate_stage.read_through([sigmoid], True) == {}  # a network output counts as it is


def test_coverage_counts_excess_against_the_calibrated_span():
    calibrated = {"a": (0.0, 10.0), "b": (-1.0, 1.0), "c": (0.0, 4.0), "flat": (2.0, 2.0)}
    seen = {"a": (0.0, 12.0), "b": (-2.0, 0.5), "c": (-0.5, 3.0), "flat": (0.0, 9.0)}
    coverage = evaluate_stage.calibration_coverage(calibrated, seen)
    # a: 2 / 10 = 0.2 (within), b: 1 / 2 = 0.5, c: 0.5 / 4 = 0.125; a constant tensor has no span
    assert coverage["tensors"] == 3 and coverage["beyond"] == 1
    assert coverage["worst"] == [{"tensor": "b", "excess": 0.5}]
    assert evaluate_stage.coverage_warning(coverage)  # 1 of 3 > 5%
    many = {**coverage, "tensors": 40}  # 1 of 40: 2.5%
    assert evaluate_stage.coverage_warning(many) == []


def _magnitude_model() -> onnx.ModelProto:
    """x -> re = x, im = 0.7 x (a Mul) -> re^2 + im^2 -> Sqrt -> y: a spectrum's magnitude."""
    two = numpy_helper.from_array(np.array(2.0, np.float32), "two")
    factor = numpy_helper.from_array(np.array(0.7, np.float32), "factor")
    nodes = [
        helper.make_node("Mul", ["x", "factor"], ["im"], name="im"),
        helper.make_node("Pow", ["x", "two"], ["re2"], name="square_re"),
        helper.make_node("Pow", ["im", "two"], ["im2"], name="square_im"),
        helper.make_node("Add", ["re2", "im2"], ["power"], name="power"),
        helper.make_node("Sqrt", ["power"], ["y"], name="magnitude"),
    ]
    graph = helper.make_graph(
        nodes, "magnitude", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, 8, 8])], [two, factor],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return onnx.shape_inference.infer_shapes(model)


def test_squares_and_their_sum_get_16_bits():
    """Heavy-tailed values (a spectrum: most small, a few large): at 8 bits the squares' grid
    rounds the many small ones to a handful of codes."""
    import tempfile
    from pathlib import Path

    data = (RNG.standard_normal((8, 3, 8, 8)) * np.exp(RNG.standard_normal((8, 3, 8, 8)))).astype(np.float32)
    results = {}
    for bits in (8, 16):
        with tempfile.TemporaryDirectory() as tmp:
            settings = {**SETTINGS, "square_bits": bits, "output_bits": 8}
            _, q, report, _ = pipeline(Path(tmp), _magnitude_model(), settings, samples=data)
            program = tensorfile.load(q["integer"])[1]["tensors"]
            results[bits] = ({name: program[name]["bits"] for name in ("re2", "im2", "power")}, report)
    assert results[8][0] == {"re2": 8, "im2": 8, "power": 8}
    assert results[16][0] == {"re2": 16, "im2": 16, "power": 16}
    (narrow,), (wide,) = (r[1]["outputs"].values() for r in (results[8], results[16]))
    assert wide["sqnr_db"] > narrow["sqnr_db"] + 6


def test_a_grid_a_max_pool_alone_reads_is_ranged_on_the_pooled_values(tmp_path):
    """A MaxPool passes its input's codes on, and max(q(x)) = q(max(x)): what flows on is the
    pooled values on that grid. So the grid is chosen on the pooled tensor's statistics, whose
    top the range must keep, not on the input's, whose squared error lets the rare large values
    (the ones the pool keeps) clip. Checked against the range that minimises the error over the
    input's own values, found by brute force here."""
    rng = np.random.default_rng(21)
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "w"], ["c"]),
            helper.make_node("Relu", ["c"], ["r"]),
            helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[4, 4], strides=[4, 4]),
            helper.make_node("Conv", ["p", "h"], ["y"]),
        ],
        "pool",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 128, 128])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 32, 32])],
        [
            numpy_helper.from_array(np.ones((1, 1, 1, 1), np.float32), "w"),
            numpy_helper.from_array(np.array([1, -1], np.float32).reshape(2, 1, 1, 1), "h"),
        ],
    )
    model = onnx.shape_inference.infer_shapes(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    )
    data = rng.standard_t(3, size=(16, 1, 128, 128)).astype(np.float32)  # a long, thin tail
    _, q, _, _ = pipeline(tmp_path, model, samples=data)
    from npubuild.intmodel.interpreter import load_integer_model

    program = load_integer_model(q["integer"])[0]
    grid = program.tensors["p"]
    assert (grid.scale, grid.zero_point) == (program.tensors["r"].scale, program.tensors["r"].zero_point)
    r = np.maximum(data.astype(np.float64), 0)  # the identity convolution's ReLU
    p = r.reshape(16, 32, 4, 32, 4).max(axis=(2, 4))

    def error(x: np.ndarray, top: float) -> float:  # a ReLU's grid: [0, top], zero at code -128
        step = top / 255
        return float(np.mean((np.clip(np.rint(x / step), 0, 255) * step - x) ** 2))

    best_for_r = min(np.linspace(0.05, 1, 120) * r.max(), key=lambda top: error(r, top))
    top = (127 - grid.zero_point) * grid.scale
    assert grid.zero_point == -128 and top > best_for_r, (top, best_for_r)
    assert error(p, top) < 0.8 * error(p, best_for_r), (error(p, top), error(p, best_for_r))
