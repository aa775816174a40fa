"""QOperator models: onnxruntime's other quantized format, where integer ops replace float ones.

- Static (`quantize_static(..., quant_format=QOperator)`): QLinearConv, QLinearMatMul and the
  com.microsoft QLinearAdd, QLinearMul, QLinearSigmoid, ... each become DequantizeLinear on their
  inputs, the float op, QuantizeLinear on the output: the QDQ form of the same model, whose
  activation grids `absorb_qdq` then keeps (prequantized.py).
- Dynamic (`quantize_dynamic`): DynamicQuantizeLinear computes a scale from each input at run
  time, which no NPU does. ConvInteger and MatMulInteger become float Conv and MatMul with the
  dequantized weights, fed the float input itself (its run-time scale becomes 1), and
  DynamicQuantizeLSTM becomes LSTM with its weights dequantized. The quantizer calibrates these
  tensors like any float model's.

The optimize stage says so in one warning (`qoperator_warning`). An op of either family this
module does not know is one error line naming it, never an internal error.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from npubuild.errors import UserError
from npubuild.stages.onnx_utils import node_attributes
from npubuild.stages.optimize.graph import Graph, node_attr

MS = "com.microsoft"
# QLinear op -> (float op, positions of its quantized inputs as (x, scale, zero point), position
# of the output's scale and zero point)
_QLINEAR: dict[tuple[str, str], tuple[str, list[tuple[int, int, int]], int]] = {
    ("", "QLinearConv"): ("Conv", [(0, 1, 2), (3, 4, 5)], 6),
    ("", "QLinearMatMul"): ("MatMul", [(0, 1, 2), (3, 4, 5)], 6),
    (MS, "QLinearAdd"): ("Add", [(0, 1, 2), (3, 4, 5)], 6),
    (MS, "QLinearMul"): ("Mul", [(0, 1, 2), (3, 4, 5)], 6),
    (MS, "QLinearSigmoid"): ("Sigmoid", [(0, 1, 2)], 3),
    (MS, "QLinearLeakyRelu"): ("LeakyRelu", [(0, 1, 2)], 3),
    (MS, "QLinearSoftmax"): ("Softmax", [(0, 1, 2)], 3),
    (MS, "QLinearGlobalAveragePool"): ("GlobalAveragePool", [(0, 1, 2)], 3),
    (MS, "QLinearAveragePool"): ("AveragePool", [(0, 1, 2)], 3),
}
_DYNAMIC = {
    ("", "DynamicQuantizeLinear"),
    ("", "ConvInteger"),
    ("", "MatMulInteger"),
    (MS, "DynamicQuantizeLSTM"),
}
# attributes of a QLinear op that its float op does not take
_NOT_FLOAT_ATTRS = {"channels_last", "opset"}


def qoperator_ops(model: onnx.ModelProto) -> dict[str, int]:
    """The QOperator ops of a model (any QLinear op, known or not), by type and count."""
    counts: dict[str, int] = {}
    for n in model.graph.node:
        if (n.domain or "", n.op_type) in _DYNAMIC or n.op_type.startswith("QLinear"):
            counts[n.op_type] = counts.get(n.op_type, 0) + 1
    return dict(sorted(counts.items()))


def qoperator_warning(counts: dict[str, int]) -> str:
    ops = ", ".join(f"{k} x{v}" for k, v in counts.items())
    static = any(k.startswith("QLinear") for k in counts)
    dynamic = any(not k.startswith("QLinear") for k in counts)
    return (
        f"the model is quantized in onnxruntime's QOperator format ({ops}): its integer ops were "
        "turned back into float ones and npubuild quantizes them again"
        + ("; the QLinear ops' activation grids are kept" if static else "")
        + ("; run-time (dynamic) input scales are replaced by calibrated ones" if dynamic else "")
    )


def _operand(node: onnx.NodeProto, k: int) -> str:
    return node.input[k] if len(node.input) > k else ""


def _float_attrs(node: onnx.NodeProto) -> dict:
    return {k: v for k, v in node_attributes(node).items() if k not in _NOT_FLOAT_ATTRS}


def _qlinear_to_qdq(g: Graph, node: onnx.NodeProto) -> None:
    float_op, quantized, out_at = _QLINEAR[(node.domain or "", node.op_type)]
    if node_attr(node, "channels_last", 0):
        raise UserError(f"{node.op_type} '{node.name}': channels_last pooling has no float form here")
    new: list[onnx.NodeProto] = []
    inputs = []
    for x, scale, zero in quantized:
        deq = g.fresh_name(f"{node.input[x]}_dq")
        args = [node.input[x], node.input[scale]] + ([_operand(node, zero)] if _operand(node, zero) else [])
        new.append(helper.make_node("DequantizeLinear", args, [deq], name=deq))
        g.types[deq] = (TensorProto.FLOAT, g.shape(node.input[x]))
        inputs.append(deq)
    if float_op == "Conv" and _operand(node, 8):
        # the int32 bias is on the grid x_scale * w_scale, zero point 0
        bias_scale = g.fresh_name(f"{node.input[8]}_scale")
        new.append(helper.make_node("Mul", [node.input[1], node.input[4]], [bias_scale], name=bias_scale))
        bias = g.fresh_name(f"{node.input[8]}_dq")
        new.append(helper.make_node("DequantizeLinear", [node.input[8], bias_scale], [bias], name=bias))
        inputs.append(bias)
    result = g.fresh_name(f"{node.output[0]}_float")
    new.append(helper.make_node(float_op, inputs, [result], name=node.name or result, **_float_attrs(node)))
    g.types[result] = (TensorProto.FLOAT, g.shape(node.output[0]))
    out_args = [result, node.input[out_at]] + (
        [_operand(node, out_at + 1)] if _operand(node, out_at + 1) else []
    )
    new.append(helper.make_node("QuantizeLinear", out_args, [node.output[0]], name=f"{result}_q"))
    index = g.nodes.index(node)
    g.nodes[index : index + 1] = new


def _qlinear_concat(g: Graph, node: onnx.NodeProto) -> None:
    """com.microsoft QLinearConcat(Y_scale, Y_zero_point, (X, X_scale, X_zero_point)...)."""
    new, inputs = [], []
    for k in range(2, len(node.input), 3):
        deq = g.fresh_name(f"{node.input[k]}_dq")
        new.append(
            helper.make_node("DequantizeLinear", [node.input[k], node.input[k + 1], node.input[k + 2]], [deq])
        )
        inputs.append(deq)
    result = g.fresh_name(f"{node.output[0]}_float")
    new.append(
        helper.make_node("Concat", inputs, [result], name=node.name or result, axis=node_attr(node, "axis"))
    )
    new.append(helper.make_node("QuantizeLinear", [result, node.input[0], node.input[1]], [node.output[0]]))
    index = g.nodes.index(node)
    g.nodes[index : index + 1] = new


def _weight(g: Graph, node: onnx.NodeProto, value: int, zero: int) -> np.ndarray:
    """A constant integer weight minus its zero point, as float32 (exact: |w - z| < 2^24)."""
    w = g.constant(_operand(node, value))
    if w is None:
        raise UserError(
            f"{node.op_type} '{node.name}': its weight is not a constant, so it has no float form"
        )
    z = g.constant(_operand(node, zero)) if _operand(node, zero) else None
    w = w.astype(np.float32)
    if z is None:
        return w
    z = z.astype(np.float32)
    if node.op_type == "ConvInteger" and z.size > 1:  # per output channel
        z = z.reshape((-1,) + (1,) * (w.ndim - 1))
    return w - z


def _integer_to_float(g: Graph, node: onnx.NodeProto, dynamic: dict[str, str]) -> None:
    """ConvInteger / MatMulInteger(x, w, x_zero_point, w_zero_point) as the float op on the input's
    float value: the dynamic quantizer's float input where there was one, else x - x_zero_point."""
    x = node.input[0]
    new: list[onnx.NodeProto] = []
    if x in dynamic:
        xf = dynamic[x]
    else:
        xf = g.fresh_name(f"{x}_float")
        new.append(helper.make_node("Cast", [x], [xf], to=TensorProto.FLOAT))
        if _operand(node, 2):
            zf = g.fresh_name(f"{node.input[2]}_float")
            new.append(helper.make_node("Cast", [node.input[2]], [zf], to=TensorProto.FLOAT))
            shifted = g.fresh_name(f"{x}_shifted")
            new.append(helper.make_node("Sub", [xf, zf], [shifted]))
            xf = shifted
    weight = g.add_constant(f"{node.input[1]}_float", _weight(g, node, 1, 3))
    float_op = "Conv" if node.op_type == "ConvInteger" else "MatMul"
    attrs = _float_attrs(node) if float_op == "Conv" else {}
    new.append(
        helper.make_node(float_op, [xf, weight], [node.output[0]], name=node.name or node.output[0], **attrs)
    )
    g.types[node.output[0]] = (TensorProto.FLOAT, g.shape(node.output[0]))
    index = g.nodes.index(node)
    g.nodes[index : index + 1] = new


def _lstm(g: Graph, node: onnx.NodeProto) -> None:
    """DynamicQuantizeLSTM: weights [directions, input, 4 * hidden] in int8 with per-direction (or
    per-column) scales -> LSTM's float [directions, 4 * hidden, input]."""
    weights = []
    for value, scale, zero in ((1, 8, 9), (2, 10, 11)):
        w = g.constant(_operand(node, value))
        s, z = g.constant(_operand(node, scale)), g.constant(_operand(node, zero))
        if w is None or s is None or z is None:
            raise UserError(f"DynamicQuantizeLSTM '{node.name}': its weights are not constants")
        per = (s.shape[0], 1, -1) if s.ndim == 2 else (-1, 1, 1)
        real = (w.astype(np.float32) - z.astype(np.float32).reshape(per)) * s.astype(np.float32).reshape(per)
        weights.append(g.add_constant(f"{node.input[value]}_float", real.transpose(0, 2, 1).copy()))
    inputs = [node.input[0], *weights, *(_operand(node, k) for k in range(3, 8))]
    while inputs and not inputs[-1]:
        inputs.pop()
    lstm = helper.make_node("LSTM", inputs, list(node.output), name=node.name or node.output[0])
    lstm.attribute.extend(node.attribute)
    index = g.nodes.index(node)
    g.nodes[index] = lstm


def dequantize_qoperator(g: Graph) -> int:
    """QOperator ops -> their QDQ or float forms (module docstring). Runs before absorb_qdq."""
    changed = 0
    # DynamicQuantizeLinear(x) -> (codes, scale, zero point): readers of the codes take x itself,
    # and its run-time scale becomes 1 (the dequantized weights carry the weights' scale)
    dynamic: dict[str, str] = {}
    for node in list(g.nodes):
        if node.op_type == "DynamicQuantizeLinear" and (node.domain or "") == "":
            dynamic[node.output[0]] = node.input[0]
    for node in list(g.nodes):
        key = (node.domain or "", node.op_type)
        if key in _QLINEAR:
            _qlinear_to_qdq(g, node)
        elif key == (MS, "QLinearConcat"):
            _qlinear_concat(g, node)
        elif key in (("", "ConvInteger"), ("", "MatMulInteger")):
            _integer_to_float(g, node, dynamic)
        elif key == (MS, "DynamicQuantizeLSTM"):
            _lstm(g, node)
        elif node.op_type.startswith("QLinear") or node.op_type.startswith("DynamicQuantize"):
            if key != ("", "DynamicQuantizeLinear"):
                raise UserError(
                    f"{node.op_type} '{node.name}' ({node.domain or 'ai.onnx'}): a quantized op "
                    "with no float form known here"
                )
            continue
        else:
            continue
        changed += 1
    for node in list(g.nodes):
        if node.op_type != "DynamicQuantizeLinear" or (node.domain or "") != "":
            continue
        codes, scale, zero = node.output
        if g.consumers().get(codes):
            raise UserError(
                f"DynamicQuantizeLinear '{node.name}': its codes feed "
                f"{sorted({c.op_type for c in g.consumers()[codes]})}, which have no float form here"
            )
        g.replace_uses(scale, g.add_constant(f"{scale}_one", np.array(1.0, np.float32)))
        g.replace_uses(zero, g.add_constant(f"{zero}_zero", np.array(0, np.uint8)))
        g.nodes.remove(node)
        changed += 1
    return changed
