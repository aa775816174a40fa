"""Lookup tables absorb the per-code ops after them (stages/quantize/absorb.py): the integer model
computes the same codes with fewer ops, and only ops that read nothing but the table's output and
constant scalars are absorbed."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from test_quantize import SETTINGS  # the settings the other quantize tests use

from npubuild.intmodel import tensorfile
from npubuild.intmodel.interpreter import Interpreter
from npubuild.intmodel.program import parse
from npubuild.stages import calibrate
from npubuild.stages.quantize.integer_model import build_integer_model

RNG = np.random.default_rng(23)


def _model() -> onnx.ModelProto:
    """Tables followed by what they may absorb and by what they may not."""
    weights = {
        "w1": RNG.normal(size=(8, 3, 3, 3)) * 0.4,
        "w2": RNG.normal(size=(8, 8, 1, 1)) * 0.4,
        "a": np.array([1.7]),  # PP-LCNet's learnable scale and bias after HardSwish
        "b": np.array([-0.3]),
        "zero": np.array(0.0),
        "six": np.array(6.0),
        "k": RNG.normal(size=(1, 8, 1, 1)),  # per channel: not a function of one code
        "c": np.array([0.25]),
        "d": np.array(-2.0),
    }
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
        helper.make_node("HardSwish", ["c1"], ["hs"], name="hardswish"),
        helper.make_node("Mul", ["a", "hs"], ["scaled"], name="scale"),
        helper.make_node("Add", ["scaled", "b"], ["shifted"], name="shift"),
        helper.make_node("Clip", ["shifted", "zero", "six"], ["clipped"], name="clip"),
        helper.make_node("Conv", ["clipped", "w2"], ["c2"], name="conv2"),
        helper.make_node("Sigmoid", ["c2"], ["sg"], name="sigmoid"),  # two readers: kept
        helper.make_node("Mul", ["sg", "c"], ["sg_scaled"], name="sg_scale"),
        helper.make_node("Add", ["sg", "c2"], ["sg_sum"], name="sg_sum"),
        helper.make_node("Tanh", ["sg_scaled"], ["th"], name="tanh"),  # a network output: kept
        helper.make_node("Mul", ["th", "d"], ["th_d"], name="th_scale"),
        helper.make_node("Mul", ["th_d", "k"], ["th_k"], name="per_channel"),  # not absorbed
        helper.make_node("Add", ["th_k", "sg_sum"], ["y"], name="join"),
        helper.make_node("Sigmoid", ["y"], ["out"], name="output_table"),  # a network output
    ]
    graph = helper.make_graph(
        nodes,
        "tables",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [
            helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 8, 8, 8]),
            helper.make_tensor_value_info("th", TensorProto.FLOAT, [1, 8, 8, 8]),
        ],
        [numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in weights.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    model.ir_version = 8
    return onnx.shape_inference.infer_shapes(model)


def _interpreters(tmp_path):
    model = _model()
    model_path = tmp_path / "m.onnx"
    onnx.save(model, model_path)
    np.save(tmp_path / "cal.npy", RNG.normal(size=(8, 3, 8, 8)).astype(np.float32))
    (tmp_path / "cal").mkdir()
    cal = calibrate.run({}, {"model": model_path, "calibration": tmp_path / "cal.npy"}, tmp_path / "cal")
    stats_arrays, stats = tensorfile.load(cal["stats"])
    built = {}
    for absorb in (False, True):
        _, meta, arrays = build_integer_model(model, stats["tensors"], stats_arrays, SETTINGS, absorb=absorb)
        program = parse(meta, "test")
        built[absorb] = program, arrays, Interpreter(program, arrays, [], {"": 14, "npubuild": 1})
    return built


def test_tables_absorb_constant_scalar_ops_and_compute_the_same_codes(tmp_path):
    built = _interpreters(tmp_path)
    (before, arrays_before, plain), (after, arrays_after, absorbed) = built[False], built[True]
    labels = [op.label for op in before.ops]
    # exactly the Mul and Add by scalars and the Clip after HardSwish; not the Mul by a scalar of
    # a table read twice (sg_scale), of a table that is a network output (th_scale), by a
    # per-channel constant (per_channel) or of two tensors (join)
    assert sorted(set(labels) - {op.label for op in after.ops}) == ["clip", "scale", "shift"]
    assert set(before.tensors) - set(after.tensors) == {"hs", "scaled", "shifted"}
    hardswish = next(op for op in after.ops if op.label == "hardswish")
    assert hardswish.kind == "lut" and hardswish.outputs == ["clipped"]
    assert len(arrays_after) < len(arrays_before)  # the absorbed scalars' arrays are gone
    for scale in (0.5, 1.0, 3.0):
        x = {"x": (RNG.normal(size=(1, 3, 8, 8)) * scale).astype(np.float32)}
        (want, env_before), (got, env_after) = plain.run(x, keep=True), absorbed.run(x, keep=True)
        for name in ("out", "th"):
            np.testing.assert_array_equal(got[name], want[name])
        for name in after.tensors:  # every tensor the absorbed model still writes
            np.testing.assert_array_equal(env_after[name], env_before[name], err_msg=name)
        assert "hs" not in env_after and "scaled" not in env_after
