"""Empirical bias correction (stages/quantize/empirical_bias.py): the integer model's per-channel
output mean follows the float model's where its input's quantization shifted it."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from test_quantize import SETTINGS

from npubuild.intmodel.interpreter import load_integer_model
from npubuild.stages import calibrate
from npubuild.stages.feeds import session
from npubuild.stages.quantize import stage as quantize_stage
from npubuild.stages.quantize.empirical_bias import MAX_SAMPLES, sample_indices, shrunk_mean


def _two_convs(second: str) -> onnx.ModelProto:
    """x -> conv 3x3 -> Relu -> a 1x1 conv, or a 2x2 stride-2 transposed conv -> y: the second
    layer sums the Relu's channels, so a clipped (biased) Relu output moves y's mean."""
    rng = np.random.default_rng(21)
    transpose = second == "ConvTranspose"
    w2_shape = (8, 4, 2, 2) if transpose else (4, 8, 1, 1)
    inits = {
        "w1": rng.normal(size=(8, 3, 3, 3)).astype(np.float32) * 0.4,
        "b1": rng.normal(size=8).astype(np.float32) * 0.2,
        "w2": np.abs(rng.normal(size=w2_shape)).astype(np.float32) * 0.5,  # one sign: errors add
        "b2": rng.normal(size=4).astype(np.float32),
    }
    strides = {"strides": [2, 2]} if transpose else {}
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu"),
        helper.make_node(second, ["r1", "w2", "b2"], ["y"], name="second", **strides),
    ]
    size = 24 if transpose else 12
    graph = helper.make_graph(
        nodes,
        "two_convs",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 12, 12])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, size, size])],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return onnx.shape_inference.infer_shapes(model)


def _mean_error(model_path, npq, data) -> np.ndarray:
    """Per output channel, the integer model's mean error against the float model on `data`."""
    float_session = session(onnx.load(model_path))
    _, _, interpreter = load_integer_model(npq)
    errors = []
    for x in data:
        reference = float_session.run(None, {"x": x[None]})[0]
        (ours,) = interpreter.run({"x": x[None]})[0].values()
        errors.append((ours - reference).mean(axis=(0, 2, 3)))
    return np.mean(errors, axis=0)


def _uncorrected(tmp_path, seed: int, samples: int):
    """The two-conv model (1x1 second layer), `samples` calibration inputs, its statistics and
    its integer model without the correction: (model, data, quantize inputs, quantize outputs)."""
    model_path = tmp_path / "m.onnx"
    model = _two_convs("Conv")
    onnx.save(model, model_path)
    data = np.random.default_rng(seed).normal(size=(samples, 3, 12, 12)).astype(np.float32)
    np.save(tmp_path / "x.npy", data)
    (tmp_path / "cal").mkdir()
    (tmp_path / "q").mkdir()
    cal = calibrate.run({}, {"model": model_path, "calibration": tmp_path / "x.npy"}, tmp_path / "cal")
    inputs = {"model": model_path, "stats": cal["stats"]}
    q = quantize_stage.run({**SETTINGS, "empirical_bias": False}, inputs, tmp_path / "q")
    return model, data, inputs, q


@pytest.mark.parametrize("second", ["Conv", "ConvTranspose"])
def test_the_correction_removes_the_mean_error_a_clipped_input_leaves(tmp_path, second):
    model_path = tmp_path / "m.onnx"
    onnx.save(_two_convs(second), model_path)
    data = np.random.default_rng(22).normal(size=(16, 3, 12, 12)).astype(np.float32)
    np.save(tmp_path / "x.npy", data)
    (tmp_path / "cal").mkdir()
    cal = calibrate.run({}, {"model": model_path, "calibration": tmp_path / "x.npy"}, tmp_path / "cal")
    # percentile 90: the Relu's largest tenth is clipped, a negative mean error in every channel
    settings = {**SETTINGS, "method": "percentile", "percentile": 90.0}
    errors, summaries = {}, {}
    for on in (False, True):
        out = tmp_path / str(on)
        out.mkdir()
        inputs = {"model": model_path, "stats": cal["stats"], "calibration": tmp_path / "x.npy"}
        q = quantize_stage.run({**settings, "empirical_bias": on}, inputs, out)
        errors[on] = _mean_error(model_path, q["integer"], data)
        summaries[on] = json.loads(q["summary"].read_text())
    assert "empirical_bias" not in summaries[False]
    corrected = summaries[True]["empirical_bias"]
    assert corrected["samples"] == 16 and corrected["layers"] >= 1
    before, after = np.abs(errors[False]), np.abs(errors[True])
    assert before.max() > 0.05  # the clipping did shift the output
    assert after.max() < 0.25 * before.max()


def test_the_shift_is_trusted_as_far_as_the_samples_agree():
    agreeing = np.array([[1.0, -2.0], [1.0, -2.0], [1.0, -2.0]])
    assert np.array_equal(shrunk_mean(agreeing), [1.0, -2.0])
    # a mean of 0.1 from samples spread by +-1: not trusted
    disagreeing = np.array([[1.1, 0.0], [-0.9, 0.0], [1.1, 0.0], [-0.9, 0.0]])
    assert shrunk_mean(disagreeing)[0] == 0.0
    # a mean of 1 with a small spread: nearly all of it
    close = np.array([[1.05], [0.95], [1.05], [0.95]])
    assert 0.99 < shrunk_mean(close)[0] < 1.0
    assert np.array_equal(shrunk_mean(np.array([[0.5, -0.5]])), [0.5, -0.5])  # one sample: as it is


def test_a_large_calibration_set_is_sampled_evenly():
    assert sample_indices(10) == list(range(10))
    picked = sample_indices(1000)
    assert len(picked) == MAX_SAMPLES and picked[0] == 0 and picked[-1] == 999
    assert max(np.diff(picked)) - min(np.diff(picked)) <= 1


def test_a_shift_that_moves_the_output_away_from_the_float_means_is_not_kept(tmp_path):
    """The float means say the second layer's output is already right, its input's mean wrong:
    the linear shift would move the output off, so the layer keeps its bias (measured, rejected)."""
    from npubuild.intmodel import tensorfile
    from npubuild.intmodel.interpreter import interpreter_for
    from npubuild.intmodel.program import parse
    from npubuild.stages.quantize import empirical_bias as eb

    model, data, _, q = _uncorrected(tmp_path, 23, 8)
    arrays, meta = tensorfile.load(q["integer"])
    program = parse(meta, "test")
    feeds = [{"x": x[None]} for x in data]
    names = {o for n in model.graph.node for o in n.output} | {"x"}
    means = eb.float_means(model, eb.correctable(program, names), feeds)
    _, integer_outputs = zip(*(interpreter_for(program, arrays).run(f, keep=True) for f in feeds))
    second = program.ops[-1]
    t = program.tensors["y"]
    from npubuild.intmodel.codes import dequantize

    means["y"] = np.stack([dequantize(env["y"], t).mean(axis=(0, 2, 3)) for env in integer_outputs])
    means["r1"] = means["r1"] + 0.5  # the input "should" be higher: a shift the output does not want
    working = dict(arrays)
    moved, summary = eb.correct_biases(program, working, interpreter_for(program, working), means, feeds)
    assert summary["rejected"] >= 1 and second.arrays.bias not in moved
    assert np.array_equal(working[second.arrays.bias], arrays[second.arrays.bias])


def test_the_samples_run_side_by_side_fit_the_memory_budget(tmp_path, monkeypatch):
    """A budget that holds three samples' live tensors: three evenly spaced samples run, and the
    calibration rows of the others are never read."""
    from npubuild.intmodel.interpreter import interpreter_for
    from npubuild.stages import feeds as feeds_module
    from npubuild.stages.quantize import empirical_bias as eb

    _, data, inputs, plain = _uncorrected(tmp_path, 24, 12)
    program, arrays, _ = load_integer_model(plain["integer"])
    peak = eb.peak_live_bytes(program, interpreter_for(program, dict(arrays)), {"x": data[:1]})
    # the input (float32) and the first conv's int codes are live at once, at the least
    assert peak >= data[0].nbytes + 8 * 12 * 12
    assert eb.samples_within(peak, 3 * peak + peak // 2) == 3
    assert eb.samples_within(peak, 1) == 1 and eb.samples_within(1, 2**40) == MAX_SAMPLES

    monkeypatch.setattr(eb, "MEMORY_BYTES", 3 * peak + peak // 2)
    rows_read = []
    original = feeds_module.SampleFile.__getitem__

    def counting(self, index):
        rows_read.append(index.start if isinstance(index, slice) else index)
        return original(self, index)

    monkeypatch.setattr(feeds_module.SampleFile, "__getitem__", counting)
    out = tmp_path / "corrected"
    out.mkdir()
    q = quantize_stage.run(
        {**SETTINGS, "empirical_bias": True}, {**inputs, "calibration": tmp_path / "x.npy"}, out
    )
    assert json.loads(q["summary"].read_text())["empirical_bias"]["samples"] == 3
    assert sorted(set(rows_read)) == [0, 5, 11]  # the first (to measure) and the three chosen
