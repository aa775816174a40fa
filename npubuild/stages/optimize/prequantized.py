"""Pre-quantized (QDQ) models: the QuantizeLinear -> DequantizeLinear pairs on activations that
quantization-aware training, onnxruntime's quantize_static or NNCF put in a model say which grid
each tensor lives on. `absorb_qdq` removes each pair and records its scale and zero point; the
quantizer then uses them instead of calibration statistics (docs/quantization.md, "Pre-quantized
models"). DequantizeLinear of constant weights is folded by fold_constants, and the quantizer
quantizes the folded weights again (per channel, symmetric: the same codes up to rounding).

The record travels in the optimized model's metadata (`npubuild.qdq`: tensor -> scale, zero
point, bits), with zero points on npubuild's signed grids (a uint8 zero point z is z - 128)."""

from __future__ import annotations

import onnx

from npubuild.stages.optimize.graph import Graph

_BITS = {
    onnx.TensorProto.INT8: (8, 0),
    onnx.TensorProto.UINT8: (8, -128),
    onnx.TensorProto.INT16: (16, 0),
    onnx.TensorProto.UINT16: (16, -32768),
}


def _operand(node: onnx.NodeProto, k: int) -> str:
    return node.input[k] if len(node.input) > k else ""


def _pair_params(g: Graph, q: onnx.NodeProto, dq: onnx.NodeProto) -> tuple[float, int, int] | None:
    """(scale, signed zero point, bits) of a per-tensor Q/DQ pair on one grid, else None."""
    scale = g.scalar(_operand(q, 1))
    if scale is None or scale <= 0 or g.scalar(_operand(dq, 1)) != scale:
        return None
    zp, dq_zp = g.constant(_operand(q, 2)), g.constant(_operand(dq, 2))
    if (zp is None) != (dq_zp is None) or (zp is not None and (zp.size != 1 or dq_zp.size != 1)):
        return None
    if zp is None:  # ONNX's default zero point: uint8 0
        zero_point, dtype = 0, onnx.TensorProto.UINT8
    else:
        zero_point, dtype = int(zp.reshape(-1)[0]), onnx.helper.np_dtype_to_tensor_dtype(zp.dtype)
        if int(dq_zp.reshape(-1)[0]) != zero_point:
            return None
    if dtype not in _BITS:
        return None
    bits, shift = _BITS[dtype]
    return scale, zero_point + shift, bits


def absorb_qdq(g: Graph) -> int:
    """x -> QuantizeLinear -> DequantizeLinear(s) -> x' (per tensor, one grid) -> x, its grid
    recorded. A QuantizeLinear may feed several DequantizeLinears (one per reader)."""
    changed = 0
    for q in list(g.nodes):  # the loop removes only the Q it is at and that Q's DQs
        if q.op_type != "QuantizeLinear":
            continue
        producers, consumers = g.producers(), g.consumers()
        readers = consumers.get(q.output[0], [])
        if not readers or q.output[0] in g.output_names():
            continue
        if any(r.op_type != "DequantizeLinear" or r.input[0] != q.output[0] for r in readers):
            continue
        grids = {_pair_params(g, q, dq) for dq in readers}
        if len(grids) != 1 or None in grids:
            continue
        scale, zero_point, bits = grids.pop()
        x = q.input[0]
        name = x
        outputs = [dq.output[0] for dq in readers if dq.output[0] in g.output_names()]
        if outputs:
            # a pair makes a graph output: the producer of x takes over its name
            source = producers.get(x)
            if len(outputs) > 1 or source is None or x in g.output_names() or len(consumers.get(x, [])) != 1:
                continue
            name = outputs[0]
            source.output[list(source.output).index(x)] = name
            g.types[name] = g.types.get(x, g.types.get(name, (0, None)))
        for dq in readers:
            if dq.output[0] != name:
                g.replace_uses(dq.output[0], name)
            g.nodes.remove(dq)
        g.nodes.remove(q)
        g.qdq[name] = {"scale": scale, "zero_point": zero_point, "bits": bits}
        if zero_point == -(1 << (bits - 1)):
            _keep_clamp_at_zero(g, name)
        changed += 1
    return changed


# producers whose outputs are never negative: a grid starting at 0 clamps nothing of theirs
_NON_NEGATIVE = {"Relu", "Sigmoid", "Softmax", "HardSigmoid"}


def _keep_clamp_at_zero(g: Graph, name: str) -> None:
    """A grid whose lowest code is 0.0 clamps negatives: quantizers fuse a Relu into the grid
    before it (onnxruntime's QOperator and QDQ formats drop Relu/Clip that way). Without the
    pair the clamp would vanish, so it comes back as a Relu, which the quantizer fuses again; the
    unclamped tensor is on the same grid (its negatives saturate to 0.0, as in the QDQ model)."""
    producer = g.producers().get(name)
    if producer is None or producer.op_type in _NON_NEGATIVE:
        return
    before = g.fresh_name(f"{name}_unclamped")
    producer.output[list(producer.output).index(name)] = before
    g.types[before] = g.types.get(name, (0, None))
    # on the same grid the codes saturate at 0.0 as the QDQ model's do; the Relu changes nothing
    g.qdq[before] = dict(g.qdq[name])
    g.nodes.insert(
        g.nodes.index(producer) + 1, onnx.helper.make_node("Relu", [before], [name], name=f"{name}_clamp")
    )


def strip_qdq(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model with its QOperator ops in float or QDQ form and its activation Q/DQ pairs removed:
    the float model the quantized one simulates, which optimize's numeric check compares against."""
    from npubuild.stages.optimize.qoperator import dequantize_qoperator

    g = Graph(model)
    dequantize_qoperator(g)
    absorb_qdq(g)
    return g.to_model()


# ops that move values without changing them: a tensor on one side is on the other's grid
_MOVES = {"Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Identity"}


def propagate_grids(g: Graph) -> int:
    """Tensors that passes made after absorb_qdq (the Transposes around a Softmax moved to the
    last axis, the Reshapes around a 1-D convolution) have no recorded grid; across a data move
    they take the grid of the tensor on its other side, which is exactly theirs."""
    if not g.qdq:
        return 0
    added = 0
    changed = True
    while changed:
        changed = False
        for node in g.nodes:
            if node.op_type not in _MOVES or not node.input or not node.output:
                continue
            x, y = node.input[0], node.output[0]
            if x in g.qdq and y not in g.qdq:
                g.qdq[y] = dict(g.qdq[x])
            elif y in g.qdq and x not in g.qdq and g.constant(x) is None:
                g.qdq[x] = dict(g.qdq[y])
            else:
                continue
            added += 1
            changed = True
    return added
