"""Pre-quantized models: a QDQ model made by onnxruntime's quantize_static compiles with its own
scales and zero points, without a calibration set, and its integer model agrees with the QDQ
model run in onnxruntime."""

from __future__ import annotations

import json
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from test_row_ops import _cosine

from conftest import OPTIMIZE_SETTINGS, REPO

sys.path.insert(0, str(REPO / "benchmarks"))
from prequantized import ort_qdq  # noqa: E402

RNG = np.random.default_rng(23)


def _float_model() -> onnx.ModelProto:
    """The same weights on every call: its own generator, not the shared one (a module fixture
    builds it before the per-test reseeding in conftest)."""
    rng = np.random.default_rng(23)
    w1 = (rng.standard_normal((8, 3, 3, 3)) * 0.3).astype(np.float32)
    w2 = (rng.standard_normal((8, 8, 3, 3)) * 0.2).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("Sigmoid", ["c2"], ["s2"]),
        helper.make_node("Mul", ["c2", "s2"], ["m2"]),
        helper.make_node("Add", ["m2", "skip"], ["y"]),
    ]
    inits = {
        "w1": w1, "b1": (rng.standard_normal(8) * 0.1).astype(np.float32),
        "w2": w2, "b2": (rng.standard_normal(8) * 0.1).astype(np.float32),
        "skip": (rng.standard_normal((1, 8, 1, 1)) * 0.5).astype(np.float32),
    }  # fmt: skip
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return onnx.shape_inference.infer_shapes(model)


@pytest.fixture(scope="module", params=["int8", "uint8"])
def qdq(tmp_path_factory, request):
    tmp = tmp_path_factory.mktemp("qdq")
    onnx.save(_float_model(), tmp / "float.onnx")
    samples = np.random.default_rng(24).standard_normal((16, 3, 16, 16)).astype(np.float32)
    ort_qdq(tmp / "float.onnx", tmp / "qdq.onnx", samples[:8], "x", unsigned=request.param == "uint8")
    np.save(tmp / "eval.npy", samples[8:])
    return tmp


def test_qdq_model_compiles_with_its_own_grids_and_no_calibration(qdq):
    from npubuild.intmodel.interpreter import load_integer_model
    from npubuild.stages.optimize import stage as optimize_stage
    from npubuild.stages.quantize import stage as quantize_stage

    qdq_path = qdq / "qdq.onnx"
    (qdq / "o").mkdir(exist_ok=True)
    (qdq / "q").mkdir(exist_ok=True)
    settings = OPTIMIZE_SETTINGS
    opt = optimize_stage.run(settings, {"model": qdq_path, "calibration": qdq / "eval.npy"}, qdq / "o")
    optimized = onnx.load(opt["model"])
    assert not any(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in optimized.graph.node)
    from test_quantize import SETTINGS

    q = quantize_stage.run(SETTINGS, {"model": opt["model"]}, qdq / "q")  # no statistics
    summary = json.loads(q["summary"].read_text())
    assert summary["float_ops"] == 0
    assert not any("no calibration statistics" in w for w in summary["warnings"])
    program, _, interpreter = load_integer_model(q["integer"])
    # the integer tensors sit on the QDQ model's grids (uint8 zero points moved to the signed grid)
    source = onnx.load(qdq_path)
    inits = {t.name: numpy_helper.to_array(t) for t in source.graph.initializer}
    q_nodes = {n.input[0]: n for n in source.graph.node if n.op_type == "QuantizeLinear"}
    x_scale = float(inits[q_nodes["x"].input[1]])
    assert program.tensors["x"].scale == pytest.approx(x_scale)
    zp = inits[q_nodes["x"].input[2]]
    assert program.tensors["x"].zero_point == int(zp) - (128 if zp.dtype == np.uint8 else 0)
    # the QDQ model's own semantics (dequantize, float op, quantize), which onnxruntime computes
    # with its graph rewrites off; with them on it fuses QLinear kernels that round elsewhere and
    # differ from its unfused form by cosine 0.989-0.9995 on this net (other seeds), while the
    # integer model agrees with the unfused form to >= 0.99997 on 12 seeds
    unfused = ort.SessionOptions()
    unfused.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(str(qdq_path), unfused, providers=["CPUExecutionProvider"])
    for sample in np.load(qdq / "eval.npy"):
        feed = {"x": sample[None]}
        got, _ = interpreter.run(feed)
        assert _cosine(got["y"], session.run(None, feed)[0]) >= 0.999


def test_a_float_model_without_calibration_is_one_clear_error(tmp_path):
    from test_quantize import SETTINGS

    from npubuild.errors import UserError
    from npubuild.stages.quantize import stage as quantize_stage

    onnx.save(_float_model(), tmp_path / "m.onnx")
    with pytest.raises(UserError, match="give the npu_model a calibration set"):
        quantize_stage.run(SETTINGS, {"model": tmp_path / "m.onnx"}, tmp_path)


def test_a_grid_starting_at_zero_keeps_its_clamp_and_every_tensor_a_grid(tmp_path):
    """A tensor that was never negative in onnxruntime's calibration (here a square) gets a grid
    starting at 0.0; absorb_qdq puts the clamp back as a Relu and the unclamped tensor takes the
    same grid, so no tensor falls back to [-1, 1] (YOLOv8n lost 0.21 of cosine that way)."""
    from test_quantize import SETTINGS

    from npubuild.intmodel.interpreter import load_integer_model
    from npubuild.stages.optimize import stage as optimize_stage
    from npubuild.stages.quantize import stage as quantize_stage

    w = (RNG.standard_normal((4, 3, 3, 3)) * 0.3).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Mul", ["c", "c"], ["sq"]),
        helper.make_node("Mul", ["sq", "half"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.array(0.5, np.float32), "half")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(onnx.shape_inference.infer_shapes(model), tmp_path / "float.onnx")
    samples = RNG.standard_normal((12, 3, 8, 8)).astype(np.float32)
    ort_qdq(tmp_path / "float.onnx", tmp_path / "qdq.onnx", samples[:8], "x")
    np.save(tmp_path / "eval.npy", samples[8:])
    (tmp_path / "o").mkdir()
    (tmp_path / "q").mkdir()
    settings = OPTIMIZE_SETTINGS
    opt = optimize_stage.run(
        settings, {"model": tmp_path / "qdq.onnx", "calibration": tmp_path / "eval.npy"}, tmp_path / "o"
    )
    assert "Relu" in {n.op_type for n in onnx.load(opt["model"]).graph.node}
    q = quantize_stage.run(SETTINGS, {"model": opt["model"]}, tmp_path / "q")
    assert not [
        w for w in json.loads(q["summary"].read_text())["warnings"] if "no calibration statistics" in w
    ]
    _, _, interpreter = load_integer_model(q["integer"])
    session = ort.InferenceSession(str(tmp_path / "qdq.onnx"), providers=["CPUExecutionProvider"])
    for sample in samples[8:]:
        feed = {"x": sample[None]}
        assert _cosine(interpreter.run(feed)[0]["y"], session.run(None, feed)[0]) >= 0.999
