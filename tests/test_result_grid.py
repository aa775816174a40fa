"""A network output and the element-wise tail that computes it get `output_bits` (16): a
detector's concatenation of box coordinates (hundreds of pixels) and class scores (0 to 1) keeps
its scores, which one int8 grid over both would round to 0 or one step."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper
from test_quantize import SETTINGS  # the settings the other quantize tests use

from conftest import calibration_stats, small_model
from npubuild.intmodel.interpreter import Interpreter
from npubuild.intmodel.program import parse
from npubuild.stages.feeds import session
from npubuild.stages.quantize.integer_model import build_integer_model

RNG = np.random.default_rng(52)


def _detector_head() -> onnx.ModelProto:
    weights = {
        "wb": RNG.normal(size=(4, 8, 1, 1)),
        "wc": RNG.normal(size=(3, 8, 1, 1)),
        "stride": np.array(40.0),
    }
    nodes = [
        helper.make_node("Conv", ["x", "wb"], ["box"], name="box_conv"),
        helper.make_node("Mul", ["box", "stride"], ["pixels"], name="to_pixels"),
        helper.make_node("Conv", ["x", "wc"], ["logits"], name="class_conv"),
        helper.make_node("Sigmoid", ["logits"], ["scores"], name="scores"),
        helper.make_node("Concat", ["pixels", "scores"], ["y"], axis=1, name="join"),
    ]
    return small_model(nodes, "head", {"x": [1, 8, 6, 6]}, {"y": [1, 7, 6, 6]}, weights)


def test_class_scores_survive_the_concatenation_with_boxes(tmp_path):
    model = _detector_head()
    samples = RNG.normal(size=(64, 8, 6, 6)).astype(np.float32)
    stats_meta, stats_arrays = calibration_stats(model, tmp_path, samples)
    x = RNG.normal(size=(1, 8, 6, 6)).astype(np.float32)
    reference = session(model).run(None, {"x": x})[0]
    score_error = {}
    for bits in (8, 16):
        _, meta, arrays = build_integer_model(
            model, stats_meta, stats_arrays, {**SETTINGS, "output_bits": bits}
        )
        program = parse(meta, "test")
        # the tail back to the MAC and the table: the Mul, both inputs of the Concat, the output
        for name in ("y", "pixels", "box", "scores"):
            assert program.tensors[name].bits == bits, name
        assert program.tensors["logits"].bits == 16  # (the Sigmoid's fine pre-activation either way)
        assert program.result_tail() == {"y", "pixels", "box", "scores"}
        (got,) = Interpreter(program, arrays, [], {"": 14}).run({"x": x})[0].values()
        score_error[bits] = float(np.abs(got[:, 4:] - reference[:, 4:]).max())
    # int8: one step of the joint grid is ~3.7, so every score rounds to 0 or one step
    assert score_error[16] < 0.05 < 0.5 < score_error[8], score_error
