"""SmoothQuant (`quantize = {"smooth": alpha}`): the float model computes the same in onnxruntime,
at alpha 0.5 each channel's largest activation equals its weight row's largest |value| (after a
LayerNorm and between ReLU-joined convolutions), and a LayerNorm another op also reads is left
alone."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

from conftest import small_model
from npubuild.stages.onnx_utils import with_outputs
from npubuild.stages.optimize.smooth import smooth_model
from npubuild.stages.optimize.stage import optimize

RNG = np.random.default_rng(5)
TOKENS, WIDTH, HIDDEN = 6, 16, 8


def _transformer_input(extra_reader: bool = False, biases: bool = False) -> onnx.ModelProto:
    """x -> LayerNormalization (gamma with two channels 50x the rest) -> two MatMuls (with
    `biases`, each plus a bias: optimize makes them Gemms between Reshapes) -> y, z."""
    gamma = np.ones(WIDTH, np.float32)
    gamma[[3, 11]] = 50.0
    inits = {
        "gamma": gamma,
        "beta": RNG.standard_normal(WIDTH).astype(np.float32),
        "wq": RNG.standard_normal((WIDTH, HIDDEN)).astype(np.float32),
        "wk": RNG.standard_normal((WIDTH, HIDDEN)).astype(np.float32),
    }
    nodes = [helper.make_node("LayerNormalization", ["x", "gamma", "beta"], ["n"], axis=-1, name="ln")]
    for out, w in (("y", "q"), ("z", "k")):
        product = f"{out}_product" if biases else out
        nodes.append(helper.make_node("MatMul", ["n", f"w{w}"], [product], name=w))
        if biases:
            inits[f"b{w}"] = RNG.standard_normal(HIDDEN).astype(np.float32)
            nodes.append(helper.make_node("Add", [product, f"b{w}"], [out]))
    outputs = {o: [1, TOKENS, HIDDEN] for o in "yz"}
    if extra_reader:  # a residual Add: it would read the divided channels
        nodes.append(helper.make_node("Add", ["n", "x"], ["r"], name="residual"))
        outputs["r"] = [1, TOKENS, WIDTH]
    return small_model(nodes, "g", {"x": [1, TOKENS, WIDTH]}, outputs, inits, opset=17)


def _run(m, x, names=()):
    m = with_outputs(m, names)  # the intermediate tensors `names` after the model's outputs
    s = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return s.run(None, {"x": x})


def _initializer(m, name):
    return next(numpy_helper.to_array(t) for t in m.graph.initializer if t.name == name)


@pytest.mark.parametrize("biases", [False, True])
def test_smoothed_model_computes_the_same_and_moves_half_the_spread(biases):
    m = _transformer_input(biases=biases)
    if biases:  # the readers are Gemms behind a Reshape to [rows, K] (matmul_bias_as_gemm)
        m, _ = optimize(m, [], 8)
        assert [n.op_type for n in m.graph.node].count("Gemm") == 2
    stack = RNG.standard_normal((4, TOKENS, WIDTH)).astype(np.float32)  # [N, *input_shape[1:]]
    samples = [x[None] for x in stack]
    out, report = smooth_model(m, stack, 0.5)
    assert report == {"layernorms": 1, "convolution_pairs": 0}
    for x in samples:
        for a, b in zip(_run(m, x), _run(out, x)):
            np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-4)
    # at alpha 0.5 the activation's and the weights' largest values per channel meet
    activation = np.max(
        [np.abs(_run(out, x, ["n"])[-1]).reshape(-1, WIDTH).max(axis=0) for x in samples], axis=0
    )
    q = next(n for n in out.graph.node if n.name == "q")
    k = next(n for n in out.graph.node if n.name == "k")
    weight = np.maximum(np.abs(_initializer(out, q.input[1])), np.abs(_initializer(out, k.input[1]))).max(
        axis=1
    )
    np.testing.assert_allclose(activation, weight, rtol=1e-4)
    # the two wide channels no longer dominate the activation's range
    before = np.max([np.abs(_run(m, x, ["n"])[-1]).reshape(-1, WIDTH).max(axis=0) for x in samples], axis=0)
    assert activation.max() / np.median(activation) < before.max() / np.median(before) / 3


def test_a_layernorm_another_op_reads_is_left_alone():
    m = _transformer_input(extra_reader=True)
    out, report = smooth_model(m, RNG.standard_normal((2, TOKENS, WIDTH)).astype(np.float32), 0.5)
    assert report == {"layernorms": 0, "convolution_pairs": 0} and out is m


def test_convolution_pairs_are_smoothed_by_their_measured_activations():
    from test_equalize import _separable, _weight

    m = _separable(group2=8)  # conv -> ReLU -> depthwise conv, channels 300x apart
    stack = RNG.standard_normal((4, 4, 8, 8)).astype(np.float32)
    assert smooth_model(m, stack, 0.5)[1] == {"layernorms": 0, "convolution_pairs": 0}  # off by default
    out, report = smooth_model(m, stack, 0.5, convolutions=True)
    assert report == {"layernorms": 0, "convolution_pairs": 1}
    samples = [x[None] for x in stack]
    for x in samples:
        np.testing.assert_allclose(_run(out, x)[0], _run(m, x)[0], rtol=1e-4, atol=1e-4)
    activation = np.max([np.abs(_run(out, x, ["u"])[-1]).max(axis=(0, 2, 3)) for x in samples], axis=0)
    weight = np.abs(_weight(out, "c2")).reshape(8, -1).max(axis=1)  # depthwise: input c is row c
    np.testing.assert_allclose(activation, weight, rtol=1e-4)
