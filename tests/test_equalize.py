"""Cross-layer equalization (`quantize = {"equalize": true}`): the float model computes the same
in onnxruntime, each equalized channel's two weight ranges match, pairs it must not touch are
left alone, and per-tensor int8 weights lose less after it."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from conftest import small_model
from npubuild.stages.optimize.equalize import equalize_model

RNG = np.random.default_rng(11)


def _run(m, x):
    s = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return s.run(None, {"x": x})[0]


def _weights(shape, spread):
    """Weights whose output channels' ranges differ by up to `spread` times."""
    w = RNG.standard_normal(shape)
    return (w * np.geomspace(1, spread, shape[0]).reshape(-1, *[1] * (len(shape) - 1))).astype(np.float32)


def _separable(activation: str = "Relu", group2: int = 8) -> onnx.ModelProto:
    """conv (4 -> 8) -> activation -> conv (8 -> 8, `group2` groups) -> y."""
    inits = {
        "w1": _weights((8, 4, 3, 3), 300.0),
        "b1": RNG.standard_normal(8).astype(np.float32),
        "w2": RNG.standard_normal((8, 8 // group2, 3, 3)).astype(np.float32),
        "b2": RNG.standard_normal(8).astype(np.float32),
    }
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["t"], pads=[1, 1, 1, 1], name="c1"),
        helper.make_node(activation, ["t"], ["u"], name="act"),
        helper.make_node("Conv", ["u", "w2", "b2"], ["y"], pads=[1, 1, 1, 1], group=group2, name="c2"),
    ]
    return small_model(nodes, "g", {"x": [1, 4, 8, 8]}, {"y": [1, 8, 8, 8]}, inits, opset=13)


def _weight(m: onnx.ModelProto, node: str) -> np.ndarray:
    conv = next(n for n in m.graph.node if n.name == node)
    return next(numpy_helper.to_array(t) for t in m.graph.initializer if t.name == conv.input[1])


@pytest.mark.parametrize("group2", [1, 2, 8])  # dense, grouped, depthwise reader
def test_equalized_model_computes_the_same_and_ranges_match(group2):
    m = _separable(group2=group2)
    out, report = equalize_model(m)
    assert report["pairs"] == 1 and report["rounds"] >= 1
    x = RNG.standard_normal((1, 4, 8, 8)).astype(np.float32)
    np.testing.assert_allclose(_run(out, x), _run(m, x), rtol=1e-4, atol=1e-4)
    w1, w2 = _weight(out, "c1"), _weight(out, "c2")
    r1 = np.abs(w1.reshape(8, -1)).max(axis=1)
    per_group = 8 // group2
    grouped = np.abs(w2.reshape(group2, 8 // group2, per_group, -1))
    r2 = grouped.max(axis=(1, 3)).reshape(-1)
    np.testing.assert_allclose(r1, r2, rtol=1e-5)
    # before, the first layer's channel ranges spread over 300x; after, far less
    before = np.abs(_weight(m, "c1").reshape(8, -1)).max(axis=1)
    assert r1.max() / r1.min() < (before.max() / before.min()) / 10


def test_a_non_homogeneous_activation_or_a_second_reader_leaves_the_pair_alone():
    m = _separable(activation="Sigmoid")  # sigmoid(x / s) != sigmoid(x) / s
    out, report = equalize_model(m)
    assert report["pairs"] == 0
    assert np.array_equal(_weight(out, "c1"), _weight(m, "c1"))
    # the activation's output also read by an Add: that reader cannot take the scale back
    m = _separable()
    m.graph.node.append(helper.make_node("Add", ["u", "u"], ["z"], name="also"))
    m.graph.output.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 8, 8, 8]))
    assert equalize_model(m)[1]["pairs"] == 0


def _per_tensor_int8(w: np.ndarray) -> np.ndarray:
    step = np.abs(w).max() / 127
    return np.round(w / step) * step


def test_per_tensor_int8_weights_lose_less_after_equalization():
    """The reason it exists: with one int8 scale per weight tensor, a channel 300x narrower than
    the widest rounds to a few steps; equalized, the same rounding costs far less at the output
    (the depthwise reader keeps each channel apart, so each channel's error is its own)."""
    m = _separable(group2=8)
    out, _ = equalize_model(m)
    x = np.random.default_rng(3).standard_normal((1, 4, 8, 8)).astype(np.float32)

    def error(model):
        exact = _run(model, x)
        rounded = onnx.ModelProto()
        rounded.CopyFrom(model)
        weights = {n.input[1] for n in rounded.graph.node if n.op_type == "Conv"}
        for t in rounded.graph.initializer:
            if t.name in weights:
                t.CopyFrom(numpy_helper.from_array(_per_tensor_int8(numpy_helper.to_array(t)), t.name))
        # each output channel's error relative to its own power: the narrow channels count
        squared = (_run(rounded, x) - exact) ** 2
        return float(np.mean(squared.mean(axis=(0, 2, 3)) / (exact**2).mean(axis=(0, 2, 3))))

    assert error(out) < 0.2 * error(m)
