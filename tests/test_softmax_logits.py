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
