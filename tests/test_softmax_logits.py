"""A classifier's Softmax output: its logits join the result tail (`output_bits`) and their grid
spans at least the gap at which the probabilities' grid rounds a class to zero, so a model
calibrated on images it was unsure of can still say "certain" on one it is sure of."""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import helper
from test_quantize import SETTINGS  # the settings the other quantize tests use

from conftest import calibration_stats, small_model
from npubuild.intmodel.interpreter import Interpreter
from npubuild.intmodel.program import parse
from npubuild.stages.feeds import session
from npubuild.stages.quantize.integer_model import build_integer_model

RNG = np.random.default_rng(61)


SIGNS = RNG.choice([-1.0, 1.0], size=16)


def _classifier() -> onnx.ModelProto:
    """Two classes whose logits are each other's negative (as PP-OCR cls's)."""
    column = 0.4 * SIGNS
    weights = {"w": np.stack([column, -column], axis=1), "b": np.zeros(2)}
    nodes = [
        helper.make_node("Gemm", ["x", "w", "b"], ["logits"], name="classifier"),
        helper.make_node("Softmax", ["logits"], ["y"], axis=1, name="probabilities"),
    ]
    return small_model(nodes, "classifier", {"x": [1, 16]}, {"y": [1, 2]}, weights)


def test_a_confident_answer_is_not_capped_by_an_unsure_calibration(tmp_path):
    model = _classifier()
    # unsure: small inputs, logits within about +-1; one sample spans the input range [-1, 1]
    unsure = RNG.uniform(-0.3, 0.3, size=(64, 16)).astype(np.float32)
    unsure[0, :2] = (1.0, -1.0)
    stats_meta, stats_arrays = calibration_stats(model, tmp_path, unsure)
    calibrated_span = stats_meta["logits"]["max"] - stats_meta["logits"]["min"]
    _, meta, arrays = build_integer_model(model, stats_meta, stats_arrays, SETTINGS)
    program = parse(meta, "test")
    assert program.tensors["logits"].bits == 16
    assert {"logits", "y"} <= program.result_tail()
    logits = program.tensors["logits"]
    lo, hi = -32768 - logits.zero_point, 32767 - logits.zero_point
    assert (hi - lo) * logits.scale >= math.log(2 * 32768) > calibrated_span

    # sure: inputs within the calibrated range that give logits of +-6.4, a gap of 12.8
    sure = [(sign * SIGNS).reshape(1, 16).astype(np.float32) for sign in (1.0, -1.0)]
    reference = session(model)
    interpreter = Interpreter(program, arrays, [], {"": 14})
    errors = []
    for x in sure:
        expected = reference.run(None, {"x": x})[0]
        (got,) = interpreter.run({"x": x})[0].values()
        errors.append(float(np.abs(got - expected).max()))
    # a grid spanning only the calibrated logits would cap the answer at 1 / (1 + e^-span)
    cap_error = 1 - 1 / (1 + math.exp(-calibrated_span))
    assert max(errors) < min(1e-3, 0.1 * cap_error), (max(errors), cap_error)


def test_a_row_of_equal_logits_on_a_coarse_int16_grid_keeps_its_mass():
    """A table read at a step of 16 codes holds the middle of each step, except entry 0, which
    every row's maximum reads: at a coarse scale (a constant-weight model's logits, ~1e19, scale
    4e14) the middle's exp rounded to 0, and 1000 equal logits gave probabilities of 0, not 1/1000."""
    from npubuild.intmodel.rowwise import softmax_rows
    from npubuild.stages.quantize.tables import exp_table

    table, rshift = exp_table(4.3e14, 16)
    assert rshift == 4
    codes = softmax_rows(np.full((2, 1000), 123, np.int64), table, rshift, 16)
    assert np.all(codes == round(32768 / 1000))


def _hadamard16() -> np.ndarray:
    h = np.ones((1, 1))
    for _ in range(4):
        h = np.block([[h, h], [h, -h]])
    return h  # 16 orthogonal rows of +-1


def _many_classes() -> onnx.ModelProto:
    """Eight classes; logit k is the input's projection on row k of a 16 x 16 Hadamard matrix,
    so an input equal to one of those rows raises its own logit and leaves the others at zero."""
    weights = {"w": (10 / 16) * _hadamard16()[:8].T, "b": np.zeros(8)}
    nodes = [
        helper.make_node("Gemm", ["x", "w", "b"], ["logits"], name="classifier"),
        helper.make_node("Softmax", ["logits"], ["y"], axis=1, name="probabilities"),
    ]
    return small_model(nodes, "classifier", {"x": [1, 16]}, {"y": [1, 8]}, weights)


def test_a_many_class_answer_can_rise_the_whole_gap_above_the_others(tmp_path):
    """A symmetric (int16) logit grid is centred on zero, so spanning the gap from end to end is
    not enough: a confident answer raises one logit while the others stay near zero, and it can
    show that only when the top end alone reaches the gap."""
    model = _many_classes()
    # unsure: small inputs, logits within about +-1; one sample (a Hadamard row no class reads,
    # so every logit 0) spans the input range [-1, 1]
    unsure = RNG.uniform(-0.1, 0.1, size=(64, 16)).astype(np.float32)
    unsure[0] = _hadamard16()[12]
    stats_meta, stats_arrays = calibration_stats(model, tmp_path, unsure)
    assert max(-stats_meta["logits"]["min"], stats_meta["logits"]["max"]) < 2.0
    _, meta, arrays = build_integer_model(model, stats_meta, stats_arrays, SETTINGS)
    program = parse(meta, "test")
    logits = program.tensors["logits"]
    assert logits.bits == 16 and logits.zero_point == 0
    assert 32767 * logits.scale >= math.log(2 * 32768)

    # sure: an input within the calibrated range that gives one logit 10 and seven 0 (the float
    # model's top probability 0.99968)
    x = _hadamard16()[3].reshape(1, 16).astype(np.float32)
    expected = session(model).run(None, {"x": x})[0]
    assert expected[0, 3] > 0.999
    (got,) = Interpreter(program, arrays, [], {"": 14}).run({"x": x})[0].values()
    # a grid whose two ends together just span the gap (+-5.59 here) caps the top class at
    # e^5.59 / (e^5.59 + 7) = 0.975: 0.026 off before this rule
    assert float(np.abs(got - expected).max()) < 1e-3
