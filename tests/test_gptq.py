"""Error-compensating weight rounding (stages/quantize/gptq.py): the im2col rows it builds H from
are the convolution onnxruntime computes, and the rounding it picks moves a layer's output less
than nearest rounding on inputs like the calibration ones."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from test_quantize import SETTINGS

from npubuild.intmodel import tensorfile
from npubuild.stages import calibrate
from npubuild.stages.feeds import session
from npubuild.stages.quantize import gptq
from npubuild.stages.quantize import stage as quantize_stage
from npubuild.stages.quantize.weights import quantize_weight


def _conv_model(w: np.ndarray, x_shape: list[int], **attrs) -> onnx.ModelProto:
    node = helper.make_node("Conv", ["x", "w"], ["y"], name="conv", **attrs)
    graph = helper.make_graph(
        [node], "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w.astype(np.float32), "w")],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize(
    "w_shape, x_shape, attrs",
    [
        ((6, 4, 3, 3), [1, 4, 11, 9], {"pads": [1, 0, 2, 1], "strides": [2, 1]}),
        ((6, 2, 3, 3), [1, 4, 12, 12], {"group": 2, "dilations": [2, 2], "pads": [2, 2, 2, 2]}),
        ((4, 1, 3, 3), [1, 4, 10, 10], {"group": 4, "pads": [1, 1, 1, 1]}),
        ((5, 3, 4), [1, 3, 17], {"pads": [1, 2], "strides": [2]}),
        ((6, 4, 3, 3), [2, 4, 7, 9], {"pads": [1, 1, 1, 1]}),
    ],
    ids=["strided", "grouped-dilated", "depthwise", "1d", "batch-2"],
)
def test_the_rows_times_the_weights_are_the_convolution(w_shape, x_shape, attrs):
    rng = np.random.default_rng(3)
    w = rng.normal(size=w_shape)
    x = rng.normal(size=x_shape).astype(np.float32)
    model = _conv_model(w, x_shape, **attrs)
    expected = session(model).run(None, {"x": x})[0]
    rows = gptq.layer_rows(model.graph.node[0], x, w)  # [positions, group, D]
    groups = rows.shape[1]
    per_group = w.reshape(groups, w.shape[0] // groups, -1)
    ours = np.concatenate([rows[:, g] @ per_group[g].T for g in range(groups)], axis=1)  # [positions, Cout]
    batch, cout, spatial = expected.shape[0], expected.shape[1], expected.shape[2:]
    ours = np.moveaxis(ours.reshape(batch, *spatial, cout), -1, 1)  # rows: batch, then positions
    assert np.allclose(ours, expected, atol=1e-4)


def test_the_rounding_moves_the_output_less_than_nearest_on_new_inputs():
    """Correlated inputs (a random mixing of 12 sources into 48 features): H from 2,000 rows, the
    output error judged on 2,000 others."""
    rng = np.random.default_rng(4)
    mixing = rng.normal(size=(12, 48))

    def inputs(n):
        return rng.normal(size=(n, 12)) @ mixing + 0.05 * rng.normal(size=(n, 48))

    w = rng.normal(size=(32, 48)) * 0.1  # [R, D]
    codes, scales = quantize_weight(w, 0, True)
    fit = inputs(2000)
    ours = gptq.round_weights(w[None], scales[None], (fit.T @ fit)[None])[0]
    assert ours.dtype == np.int8 and np.abs(ours).max() <= 127
    assert np.abs(ours.astype(int) - codes).max() >= 1  # other roundings than nearest

    def output_error(q):
        return float((((w - q * scales[:, None]) @ inputs(2000).T) ** 2).sum())

    assert output_error(ours) < 0.5 * output_error(codes)


def test_an_input_h_never_saw_keeps_nearest_rounding():
    rng = np.random.default_rng(5)
    w = rng.normal(size=(1, 3, 4))
    codes, scales = quantize_weight(w[0], 0, True)
    x = rng.normal(size=(100, 4))
    x[:, 2] = 0.0  # never active
    ours = gptq.round_weights(w, scales[None], (x.T @ x)[None])[0]
    assert np.array_equal(ours[:, 2], codes[:, 2])


def test_quantize_rounds_the_covered_layers_and_leaves_the_pooled_ones(tmp_path):
    """A 3x3 conv over 12x12 maps (144 rows per sample) is rounded by GPTQ; a 1x1 conv after a
    global pool (one row per sample, fewer rows than columns) keeps nearest rounding. Two builds
    write the same bytes."""
    rng = np.random.default_rng(6)
    inits = {
        "w1": rng.normal(size=(8, 3, 3, 3)) * 0.4,
        "w2": rng.normal(size=(4, 8, 1, 1)) * 0.4,
    }
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu"),
        helper.make_node("GlobalAveragePool", ["r1"], ["p"], name="pool"),
        helper.make_node("Conv", ["p", "w2"], ["y"], name="conv2"),
    ]
    graph = helper.make_graph(
        nodes, "pooled", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 12, 12])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 1, 1])],
        [numpy_helper.from_array(v.astype(np.float32), k) for k, v in inits.items()],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    model_path = tmp_path / "m.onnx"
    onnx.save(onnx.shape_inference.infer_shapes(model), model_path)
    np.save(tmp_path / "x.npy", rng.normal(size=(12, 3, 12, 12)).astype(np.float32))
    (tmp_path / "cal").mkdir()
    cal = calibrate.run({}, {"model": model_path, "calibration": tmp_path / "x.npy"}, tmp_path / "cal")
    inputs = {"model": model_path, "stats": cal["stats"], "calibration": tmp_path / "x.npy"}
    built = {}
    for name, rounding in [("nearest", "nearest"), ("gptq", "gptq"), ("again", "gptq")]:
        out = tmp_path / name
        out.mkdir()
        settings = {**SETTINGS, "empirical_bias": False, "weight_rounding": rounding}
        built[name] = quantize_stage.run(settings, inputs, out)["integer"]
    arrays = {name: tensorfile.load(path)[0] for name, path in built.items()}
    meta = tensorfile.load(built["gptq"])[1]
    weight = {op["node"]: op["arrays"]["weight"] for op in meta["ops"] if op["kind"] == "conv"}
    assert not np.array_equal(arrays["gptq"][weight["conv1"]], arrays["nearest"][weight["conv1"]])
    assert np.array_equal(arrays["gptq"][weight["conv2"]], arrays["nearest"][weight["conv2"]])
    assert built["gptq"].read_bytes() == built["again"].read_bytes()


def test_h_is_not_built_for_a_layer_with_too_few_rows_or_too_large_an_h(monkeypatch):
    """A classifier after a pool (one row per sample, 300 columns) is left out before any H is
    allocated; so is a convolution whose H would pass MAX_GRAM_BYTES."""
    rng = np.random.default_rng(7)
    w_fc = rng.normal(size=(300, 4)).astype(np.float32)
    w_conv = rng.normal(size=(4, 3, 3, 3)).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "wc"], ["c"], pads=[1, 1, 1, 1], name="conv"),
        helper.make_node("Reshape", ["x", "shape"], ["flat"], name="flatten"),
        helper.make_node("MatMul", ["flat", "wf"], ["y"], name="fc"),
    ]
    graph = helper.make_graph(
        nodes, "two", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 10, 10])],
        [helper.make_tensor_value_info("c", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w_conv, "wc"), numpy_helper.from_array(w_fc, "wf"),
         numpy_helper.from_array(np.array([1, 300], np.int64), "shape")],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    constants = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    feeds = [{"x": rng.normal(size=(1, 3, 10, 10)).astype(np.float32)} for _ in range(4)]
    grams = gptq.gram_matrices(model, constants, feeds)
    assert set(grams) == {"conv"} and grams["conv"].shape == (1, 27, 27)
    monkeypatch.setattr(gptq, "MAX_GRAM_BYTES", 27 * 27 * 8 - 1)
    assert gptq.gram_matrices(model, constants, feeds) == {}
