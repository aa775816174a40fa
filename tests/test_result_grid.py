"""A network output and the element-wise tail that computes it get `output_bits` (16): a
detector's concatenation of box coordinates (hundreds of pixels) and class scores (0 to 1) keeps
its scores, which one int8 grid over both would round to 0 or one step."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from test_quantize import SETTINGS  # the quantizer defaults the other quantize tests use

from npubuild.intmodel import tensorfile
from npubuild.intmodel.interpreter import Interpreter
from npubuild.intmodel.program import parse
from npubuild.stages import calibrate
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
    graph = helper.make_graph(
        nodes,
        "head",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 6, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 7, 6, 6])],
        [numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in weights.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    model.ir_version = 8
    return onnx.shape_inference.infer_shapes(model)


def test_class_scores_survive_the_concatenation_with_boxes(tmp_path):
    model = _detector_head()
    onnx.save(model, tmp_path / "m.onnx")
    np.save(tmp_path / "cal.npy", RNG.normal(size=(64, 8, 6, 6)).astype(np.float32))
    (tmp_path / "cal").mkdir()
    cal = calibrate.run(
        {}, {"model": tmp_path / "m.onnx", "calibration": tmp_path / "cal.npy"}, tmp_path / "cal"
    )
    stats_arrays, stats = tensorfile.load(cal["stats"])
    x = RNG.normal(size=(1, 8, 6, 6)).astype(np.float32)
    reference = session(model).run(None, {"x": x})[0]
    score_error = {}
    for bits in (8, 16):
        _, meta, arrays = build_integer_model(
            model, stats["tensors"], stats_arrays, {**SETTINGS, "output_bits": bits}
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
