"""The recognition passes (optimize/recognise.py) on hand-built graphs in the forms exporters
write: the rewrite happens, and onnxruntime gives the same outputs before and after."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper
from test_optimize_passes import check_same, model, ops, x_info

from npubuild.stages.optimize.stage import optimize

RNG = np.random.default_rng(5)


def _layernorm_nodes(mean_axes, square: str, opset: int):
    def mean(i, o):
        if opset >= 18:
            return helper.make_node("ReduceMean", [i, "axes"], [o], keepdims=1)
        return helper.make_node("ReduceMean", [i], [o], axes=mean_axes, keepdims=1)

    sq = (
        helper.make_node("Pow", ["d", "two"], ["p"])
        if square == "pow"
        else helper.make_node("Mul", ["d", "d"], ["p"])
    )
    return [
        mean("x", "m"),
        helper.make_node("Sub", ["x", "m"], ["d"]),
        sq,
        mean("p", "v"),
        helper.make_node("Add", ["v", "eps"], ["a"]),
        helper.make_node("Sqrt", ["a"], ["s"]),
        helper.make_node("Div", ["d", "s"], ["n"]),
        helper.make_node("Mul", ["n", "gamma"], ["g"]),
        helper.make_node("Add", ["g", "beta"], ["y"]),
    ]


@pytest.mark.parametrize(
    "opset, square, axes, fused",
    [(13, "pow", [-1], "LayerNorm"), (13, "mul", [2], "LayerNorm"), (17, "pow", [-1], "LayerNormalization"),
     (18, "pow", [-1], "LayerNormalization")],
)  # fmt: skip
def test_decomposed_layernorm_becomes_one_node(opset, square, axes, fused):
    inits = [
        ("two", np.array(2.0, np.float32)),
        ("eps", np.array(1e-5, np.float32)),
        ("gamma", RNG.uniform(0.5, 1.5, 40).astype(np.float32)),
        ("beta", RNG.standard_normal(40).astype(np.float32)),
    ]
    if opset >= 18:
        inits.append(("axes", np.array(axes, np.int64)))
    m = model(_layernorm_nodes(axes, square, opset), [x_info([1, 25, 40])], [x_info(None, "y")], inits, opset)
    out, _ = optimize(m, [], 8)
    assert ops(out) == [fused]
    check_same(m, out, [1, 25, 40], atol=1e-4)


def test_layernorm_over_another_axis_is_left_alone():
    inits = [("two", np.array(2.0, np.float32)), ("eps", np.array(1e-5, np.float32)),
             ("gamma", np.ones(1, np.float32)), ("beta", np.zeros(1, np.float32))]  # fmt: skip
    m = model(_layernorm_nodes([1], "pow", 13), [x_info([1, 25, 40])], [x_info(None, "y")], inits)
    out, _ = optimize(m, [], 8)
    assert "LayerNorm" not in ops(out) and "ReduceMean" in ops(out)


@pytest.mark.parametrize(
    "form", ["half_first", "x_times_a_then_half", "a_times_half_then_x", "mul_by_rsqrt2"]
)
def test_gelu_forms_are_recognised(form):
    inits = [("r2", np.array(np.sqrt(2), np.float32)), ("one", np.array(1.0, np.float32)),
             ("half", np.array(0.5, np.float32)), ("ir2", np.array(1 / np.sqrt(2), np.float32))]  # fmt: skip
    scale = (
        helper.make_node("Mul", ["x", "ir2"], ["t"])
        if form == "mul_by_rsqrt2"
        else helper.make_node("Div", ["x", "r2"], ["t"])
    )
    head = [scale, helper.make_node("Erf", ["t"], ["e"]), helper.make_node("Add", ["e", "one"], ["a"])]
    if form == "half_first":
        tail = [helper.make_node("Mul", ["x", "half"], ["h"]), helper.make_node("Mul", ["h", "a"], ["y"])]
    elif form == "a_times_half_then_x":
        tail = [helper.make_node("Mul", ["a", "half"], ["h"]), helper.make_node("Mul", ["x", "h"], ["y"])]
    else:
        tail = [helper.make_node("Mul", ["x", "a"], ["h"]), helper.make_node("Mul", ["h", "half"], ["y"])]
    m = model(head + tail, [x_info([1, 8, 16])], [x_info(None, "y")], inits)
    out, _ = optimize(m, [], 8)
    assert ops(out) == ["GELU"]
    check_same(m, out, [1, 8, 16])


def test_lrn_becomes_a_window_convolution_and_a_power():
    m = model(
        [helper.make_node("LRN", ["x"], ["y"], size=5, alpha=1e-3, beta=0.75, bias=2.0)],
        [x_info([1, 12, 6, 6])],
        [x_info(None, "y")],
    )
    out, _ = optimize(m, [], 8)
    assert sorted(ops(out)) == ["Conv", "Mul", "Mul", "Pow"]
    check_same(m, out, [1, 12, 6, 6])


def test_attention_qkv_split_of_rank_5_moves_on_4_axes():
    """PP-OCRv4 rec's q/k/v split: Reshape to [1, T, 3, H, d], Transpose to [3, 1, H, T, d],
    Slice and Squeeze each; after optimize only views (Reshape, Squeeze) touch rank-5 tensors."""
    import onnx

    inits = [("shape", np.array([1, 10, 3, 4, 6], np.int64)), ("axes", np.array([0], np.int64)),
             ("sq", np.array([0], np.int64))]  # fmt: skip
    nodes = [
        helper.make_node("Reshape", ["x", "shape"], ["r"]),
        helper.make_node("Transpose", ["r"], ["t"], perm=[2, 0, 3, 1, 4]),
    ]
    outputs = []
    for k in range(3):
        inits += [(f"s{k}", np.array([k], np.int64)), (f"e{k}", np.array([k + 1], np.int64))]
        nodes.append(helper.make_node("Slice", ["t", f"s{k}", f"e{k}", "axes"], [f"p{k}"]))
        nodes.append(helper.make_node("Squeeze", [f"p{k}", "sq"], [f"y{k}"]))
        outputs.append(x_info(None, f"y{k}"))
    m = model(nodes, [x_info([1, 10, 72])], outputs, inits)
    out, _ = optimize(m, [], 8)
    check_same(m, out, [1, 10, 72])
    inferred = onnx.shape_inference.infer_shapes(out)
    ranks = {v.name: len(v.type.tensor_type.shape.dim) for v in inferred.graph.value_info}
    for node in out.graph.node:
        if node.op_type not in ("Reshape", "Squeeze", "Unsqueeze"):
            assert all(ranks.get(t, 0) <= 4 for t in [*node.input[:1], *node.output]), node
    assert ops(out).count("Transpose") == 1 and ops(out).count("Slice") == 3


@pytest.mark.parametrize(
    "batch, stride, pads, group", [(1, 1, [1, 1], 1), (16, 2, [0, 2], 1), (4, 1, [1, 1], 4)]
)
def test_a_1d_convolution_becomes_a_2d_one_over_rows(batch, stride, pads, group):
    """Silero VAD's 1-D convolutions over a batch of 16 frames: a 2-D convolution over [1, C, N, L]
    (Transposes around it when N > 1), the same numbers."""
    w = RNG.standard_normal((8, 8 // group, 3)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["y"], strides=[stride], pads=pads, group=group)]
    inits = [("w", w), ("b", RNG.standard_normal(8).astype(np.float32))]
    m = model(nodes, [x_info([batch, 8, 20])], [x_info(None, "y")], inits, 13)
    out, _ = optimize(m, [], 8)
    convs = [n for n in out.graph.node if n.op_type == "Conv"]
    assert len(convs) == 1 and [a.ints for a in convs[0].attribute if a.name == "kernel_shape"] == [[1, 3]]
    assert ("Transpose" in ops(out)) == (batch > 1)
    check_same(m, out, [batch, 8, 20], atol=1e-4)


@pytest.mark.parametrize("shape, axis", [([1, 16, 4, 35], 1), ([2, 5, 7], 0), ([1, 6, 9], -2)])
def test_a_softmax_over_another_axis_becomes_one_over_the_last(shape, axis):
    """YOLOv8's DFL Softmax over 16 bins on axis 1: Transpose, Softmax(-1), Transpose back."""
    m = model(
        [helper.make_node("Softmax", ["x"], ["y"], axis=axis)], [x_info(shape)], [x_info(None, "y")], [], 13
    )
    out, _ = optimize(m, [], 8)
    assert ops(out) == ["Transpose", "Softmax", "Transpose"]
    softmax = next(n for n in out.graph.node if n.op_type == "Softmax")
    assert [a.i for a in softmax.attribute if a.name == "axis"] == [-1]
    check_same(m, out, shape, atol=1e-6)


@pytest.mark.parametrize(
    "transform, how, out",
    [("half_pixel", "sizes", [1, 3, 7, 9]), ("align_corners", "scales", [1, 3, 8, 10]),
     ("asymmetric", "scales", [1, 3, 8, 10]), ("pytorch_half_pixel", "sizes", [1, 3, 4, 11])],
)  # fmt: skip
def test_a_linear_resize_becomes_matmuls_with_interpolation_matrices(transform, how, out):
    shape = [1, 3, 4, 5]
    if how == "sizes":
        inputs, inits = ["x", "", "", "sizes"], [("sizes", np.array(out, np.int64))]
    else:
        inputs, inits = ["x", "", "scales"], [("scales", np.array([1, 1, 2, 2], np.float32))]
    node = helper.make_node("Resize", inputs, ["y"], mode="linear", coordinate_transformation_mode=transform)
    m = model([node], [x_info(shape)], [x_info(None, "y")], inits, 13)
    optimized, _ = optimize(m, [], 8)
    assert "Resize" not in ops(optimized) and ops(optimized).count("MatMul") == (
        1 if out[2] == shape[2] else 2
    )
    check_same(m, optimized, shape, atol=1e-5)
