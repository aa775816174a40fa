"""Recognition passes: decomposed forms of LayerNormalization and GELU, as exporters that lack the
op write them, become one node (a model-local npubuild function that still runs in onnxruntime,
or ONNX's own LayerNormalization from opset 17), which has an integer form; and LRN becomes the
element-wise ops and the 1x1 convolution it is made of. Each returns its number of rewrites."""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import helper

from npubuild.stages.optimize.graph import NPUBUILD_DOMAIN, Graph, node_attr


def _only_use(g: Graph, name: str, consumers: dict, users: int = 1) -> bool:
    return name not in g.output_names() and len(consumers.get(name, [])) == users


def _last_axis_mean(g: Graph, node: onnx.NodeProto | None) -> bool:
    """A ReduceMean over the last axis only, keeping it (axes as attribute or, from opset 18, input)."""
    if node is None or node.op_type != "ReduceMean" or not node_attr(node, "keepdims", 1):
        return False
    axes = node_attr(node, "axes")
    if axes is None and len(node.input) > 1 and node.input[1]:
        value = g.constant(node.input[1])
        axes = None if value is None else value.reshape(-1).tolist()
    shape = g.shape(node.input[0])
    if not axes or len(axes) != 1 or shape is None:
        return False
    return axes[0] in (-1, len(shape) - 1)


def _layernorm_function(opset: int) -> onnx.FunctionProto:
    def mean(i: str, o: str) -> onnx.NodeProto:  # over the last axis: an input from opset 18
        if opset >= 18:
            return helper.make_node("ReduceMean", [i, "Axes"], [o], keepdims=1)
        return helper.make_node("ReduceMean", [i], [o], axes=[-1], keepdims=1)

    axes = [helper.make_node("Constant", [], ["Axes"], value_ints=[-1])] if opset >= 18 else []
    body = [
        *axes,
        mean("X", "M"),
        helper.make_node("Sub", ["X", "M"], ["D"]),
        helper.make_node("Mul", ["D", "D"], ["P"]),
        mean("P", "V"),
        helper.make_node("Add", ["V", "Epsilon"], ["A"]),
        helper.make_node("Sqrt", ["A"], ["S"]),
        helper.make_node("Div", ["D", "S"], ["N"]),
        helper.make_node("Mul", ["N", "Scale"], ["G"]),
        helper.make_node("Add", ["G", "B"], ["Y"]),
    ]
    return helper.make_function(
        NPUBUILD_DOMAIN,
        "LayerNorm",
        ["X", "Scale", "B", "Epsilon"],
        ["Y"],
        body,
        [helper.make_opsetid("", opset)],
    )


def _match_layernorm(g: Graph, div: onnx.NodeProto, producers: dict, consumers: dict):
    """Div(x - mean(x), sqrt(mean((x - mean(x))^2) + eps)) -> (x, eps, matched nodes)."""
    sub, sqrt = producers.get(div.input[0]), producers.get(div.input[1])
    if sub is None or sub.op_type != "Sub" or sqrt is None or sqrt.op_type != "Sqrt":
        return None
    mean = producers.get(sub.input[1])
    if not _last_axis_mean(g, mean) or mean.input[0] != sub.input[0]:
        return None
    add = producers.get(sqrt.input[0])
    if add is None or add.op_type != "Add":
        return None
    eps = g.scalar(add.input[1])
    var = producers.get(add.input[0])
    if eps is None or not _last_axis_mean(g, var):
        return None
    square = producers.get(var.input[0])
    if square is None or not (
        (square.op_type == "Pow" and g.scalar(square.input[1]) == 2.0 and square.input[0] == sub.output[0])
        or (square.op_type == "Mul" and list(square.input) == [sub.output[0]] * 2)
    ):
        return None
    x = sub.input[0]
    matched = [mean, sub, square, var, add, sqrt, div]
    # x - mean(x) is read by the square (twice by a Mul) and the Div; the rest once
    uses = {sub.output[0]: 2 if square.op_type == "Pow" else 3}
    if not all(_only_use(g, n.output[0], consumers, uses.get(n.output[0], 1)) for n in matched[:-1]):
        return None
    return x, eps, matched


def _affine_after(g: Graph, node: onnx.NodeProto, op_type: str, consumers: dict, n: int):
    """The single consumer of `node` that multiplies (adds) it by a constant vector of the last
    axis's length: (its constant, the node), else None."""
    users = consumers.get(node.output[0], [])
    if len(users) != 1 or users[0].op_type != op_type or node.output[0] in g.output_names():
        return None
    user = users[0]
    other = user.input[1] if user.input[0] == node.output[0] else user.input[0]
    value = g.constant(other)
    if value is None or value.size not in (1, n) or (value.ndim > 1 and value.shape[-1] != value.size):
        return None
    return np.broadcast_to(value.reshape(-1).astype(np.float32), (n,)).copy(), user


def fuse_layernorm(g: Graph) -> int:
    """The decomposed LayerNormalization over the last axis (with the Mul and Add of its scale
    and bias when they follow) -> one LayerNorm node (LayerNormalization from opset 17)."""
    changed = 0
    for div in list(g.nodes):
        if div not in g.nodes or div.op_type != "Div":
            continue
        producers, consumers = g.producers(), g.consumers()
        match = _match_layernorm(g, div, producers, consumers)
        shape = g.shape(div.input[0])
        if match is None or not shape:
            continue
        x, eps, matched = match
        n = int(shape[-1])
        gamma, beta = np.ones(n, np.float32), np.zeros(n, np.float32)
        scale = _affine_after(g, div, "Mul", consumers, n)
        if scale is not None:
            gamma, mul = scale
            matched.append(mul)
            bias = _affine_after(g, mul, "Add", consumers, n)
            if bias is not None:
                beta, add = bias
                matched.append(add)
        last = matched[-1]
        inputs = [
            x,
            g.add_constant(f"{last.output[0]}_gamma", gamma),
            g.add_constant(f"{last.output[0]}_beta", beta),
        ]
        name = last.name or last.output[0]
        if g.opset >= 17:
            fused = helper.make_node(
                "LayerNormalization", inputs, [last.output[0]], name=name, axis=-1, epsilon=eps
            )
        else:
            inputs.append(g.add_constant(f"{last.output[0]}_eps", np.array(eps, np.float32)))
            fused = helper.make_node("LayerNorm", inputs, [last.output[0]], name=name, domain=NPUBUILD_DOMAIN)
            g.use_function(_layernorm_function(g.opset))
        g.replace_node(matched, fused)
        changed += 1
    return changed


def _gelu_function(opset: int) -> onnx.FunctionProto:
    body = [
        helper.make_node("Constant", [], ["R"], value_float=float(np.float32(1 / math.sqrt(2)))),
        helper.make_node("Constant", [], ["One"], value_float=1.0),
        helper.make_node("Constant", [], ["Half"], value_float=0.5),
        helper.make_node("Mul", ["X", "R"], ["T"]),
        helper.make_node("Erf", ["T"], ["E"]),
        helper.make_node("Add", ["E", "One"], ["A"]),
        helper.make_node("Mul", ["X", "A"], ["P"]),
        helper.make_node("Mul", ["P", "Half"], ["Y"]),
    ]
    return helper.make_function(NPUBUILD_DOMAIN, "GELU", ["X"], ["Y"], body, [helper.make_opsetid("", opset)])


def _scaled_input(g: Graph, node: onnx.NodeProto | None, factor: float) -> str | None:
    """x when `node` is x / (1 / factor) or x * factor (a scalar constant), else None."""
    if node is None or node.op_type not in ("Div", "Mul"):
        return None
    value = g.scalar(node.input[1])
    if value is None or value == 0:
        return None
    actual = 1 / value if node.op_type == "Div" else value
    return node.input[0] if math.isclose(actual, factor, rel_tol=1e-4) else None


def fuse_gelu(g: Graph) -> int:
    """x * 0.5 * (1 + erf(x / sqrt(2))), in its exporters' orders of the products -> GELU(x)."""
    changed = 0
    for erf in list(g.nodes):
        if erf not in g.nodes or erf.op_type != "Erf":
            continue
        producers, consumers = g.producers(), g.consumers()
        scale = producers.get(erf.input[0])
        x = _scaled_input(g, scale, 1 / math.sqrt(2))
        users = consumers.get(erf.output[0], [])
        if x is None or len(users) != 1 or users[0].op_type != "Add":
            continue
        add = users[0]
        one = add.input[1] if add.input[0] == erf.output[0] else add.input[0]
        if g.scalar(one) != 1.0 or not _only_use(g, scale.output[0], consumers):
            continue
        match = _gelu_products(g, x, add, producers, consumers)
        if match is None:
            continue
        matched = [scale, erf, add, *match]
        last = matched[-1]
        fused = helper.make_node(
            "GELU", [x], [last.output[0]], name=last.name or last.output[0], domain=NPUBUILD_DOMAIN
        )
        g.use_function(_gelu_function(g.opset))
        g.replace_node(matched, fused)
        changed += 1
    return changed


def _gelu_products(g: Graph, x: str, add: onnx.NodeProto, producers: dict, consumers: dict):
    """The Muls that make x * (1 + erf) * 0.5 from `add`: (x * 0.5) * a, (x * a) * 0.5 or x * (a * 0.5)."""
    users = consumers.get(add.output[0], [])
    if len(users) != 1 or users[0].op_type != "Mul" or add.output[0] in g.output_names():
        return None
    mul = users[0]
    other = mul.input[1] if mul.input[0] == add.output[0] else mul.input[0]
    if other == x:  # (x * a) * 0.5
        nxt = consumers.get(mul.output[0], [])
        if len(nxt) == 1 and nxt[0].op_type == "Mul" and _scaled_input(g, nxt[0], 0.5) == mul.output[0]:
            if mul.output[0] not in g.output_names():
                return [mul, nxt[0]]
        return None
    if g.scalar(other) == 0.5:  # x * (a * 0.5)
        nxt = consumers.get(mul.output[0], [])
        if (
            len(nxt) == 1
            and nxt[0].op_type == "Mul"
            and x in nxt[0].input
            and mul.output[0] not in g.output_names()
        ):
            return [mul, nxt[0]]
        return None
    half = producers.get(other)  # (x * 0.5) * a
    if _scaled_input(g, half, 0.5) == x and _only_use(g, half.output[0], consumers):
        return [half, mul]
    return None


def decompose_lrn(g: Graph) -> int:
    """LRN -> x * (bias + alpha / size * sum of x^2 over `size` neighbouring channels)^-beta: a Mul,
    a 1x1 convolution with a band of ones (the channel window), a Pow and a Mul, all of which run
    on the NPU. ONNX's window is [c - floor((size-1)/2), c + ceil((size-1)/2)]."""
    changed = 0
    for lrn in list(g.nodes):
        shape = g.shape(lrn.input[0]) if lrn.op_type == "LRN" else None
        if not shape or len(shape) != 4 or not shape[1]:
            continue
        c = int(shape[1])
        size = int(node_attr(lrn, "size"))
        alpha, beta = float(node_attr(lrn, "alpha", 1e-4)), float(node_attr(lrn, "beta", 0.75))
        bias = float(node_attr(lrn, "bias", 1.0))
        lo, hi = (size - 1) // 2, (size - 1) - (size - 1) // 2
        band = np.zeros((c, c, 1, 1), np.float32)
        for out in range(c):
            band[out, max(0, out - lo) : min(c, out + hi + 1), 0, 0] = alpha / size
        base = lrn.output[0]
        x = lrn.input[0]
        sq, total, power = (g.fresh_name(f"{base}_{s}") for s in ("square", "window", "power"))
        name = lrn.name or base
        nodes = [
            helper.make_node("Mul", [x, x], [sq], name=f"{name}_square"),
            helper.make_node(
                "Conv",
                [
                    sq,
                    g.add_constant(f"{base}_band", band),
                    g.add_constant(f"{base}_bias", np.full(c, bias, np.float32)),
                ],
                [total],
                name=f"{name}_window",
            ),
            helper.make_node(
                "Pow",
                [total, g.add_constant(f"{base}_beta", np.array(-beta, np.float32))],
                [power],
                name=f"{name}_power",
            ),
            helper.make_node("Mul", [x, power], [base], name=name),
        ]
        index = g.nodes.index(lrn)
        g.nodes[index : index + 1] = nodes
        changed += 1
    return changed
