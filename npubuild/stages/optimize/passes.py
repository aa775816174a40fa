"""The optimization passes. Each takes the graph, rewrites it in place and returns how many
rewrites it made; the stage runs them in order until none makes a change (a fixpoint)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx
from onnx import helper, numpy_helper

from npubuild.stages.optimize.canonical import (
    _single_use,
    affine_terms,
    batchnorm_to_affine,
    bn_affine,
    clamps_before_moves,
    conv1d_as_2d,
    linear_resize_as_matmuls,
    merge_affines,
    merge_untouched_axes,
    per_channel,
    pools_before_widening_convs,
    softmax_to_last_axis,
    squeeze_unit_axes,
    sum_to_add,
)
from npubuild.stages.optimize.gemm import matmul_bias_as_gemm
from npubuild.stages.optimize.graph import NPUBUILD_DOMAIN, Graph, node_attr
from npubuild.stages.optimize.prequantized import absorb_qdq
from npubuild.stages.optimize.qoperator import dequantize_qoperator
from npubuild.stages.optimize.recognise import decompose_lrn, fuse_gelu, fuse_layernorm
from npubuild.stages.optimize.transposes import transposes_through_elementwise, unit_transposes_as_reshapes

# Folding would grow the model past this many elements per tensor (Expand, ConstantOfShape...).
MAX_FOLDED_ELEMENTS = 1 << 20
_NONDETERMINISTIC = {"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Multinomial"}
_CONTROL_FLOW = {"If", "Loop", "Scan"}


def constants_to_initializers(g: Graph) -> int:
    changed = 0
    for node in list(g.nodes):
        if node.op_type != "Constant" or node.domain not in ("", "ai.onnx") or not node.attribute:
            continue
        a = node.attribute[0]
        if a.name == "value":
            value = numpy_helper.to_array(a.t)
        elif a.name in ("value_float", "value_int"):
            value = np.array(
                helper.get_attribute_value(a), dtype=np.float32 if a.name == "value_float" else np.int64
            )
        elif a.name in ("value_floats", "value_ints"):
            value = np.array(
                helper.get_attribute_value(a), dtype=np.float32 if a.name == "value_floats" else np.int64
            )
        else:
            continue
        if node.output[0] in g.output_names():
            continue
        g.constants[node.output[0]] = value
        g.nodes.remove(node)
        changed += 1
    return changed


def fold_shapes(g: Graph) -> int:
    changed = 0
    for node in list(g.nodes):
        if node.op_type not in ("Shape", "Size") or node.output[0] in g.output_names():
            continue
        shape = g.shape(node.input[0])
        if shape is None:
            continue
        if node.op_type == "Size":
            value = np.array(int(np.prod(shape, dtype=np.int64)), dtype=np.int64)
        else:
            start, end = node_attr(node, "start", 0), node_attr(node, "end", None)
            value = np.array(shape[start:end], dtype=np.int64)
        g.constants[node.output[0]] = value
        g.nodes.remove(node)
        changed += 1
    return changed


def _evaluate(node: onnx.NodeProto, g: Graph) -> list[np.ndarray]:
    from onnx.reference import ReferenceEvaluator

    evaluator = ReferenceEvaluator(node, opsets={"": g.opset})
    feeds = {i: g.constants[i] for i in node.input if i}
    return evaluator.run(None, feeds)


# Inputs that are a layer's parameters: a large constant subgraph that computes one (weights made
# by ConstantOfShape, a reshaped or transposed weight) is folded whatever its size, up to this.
WEIGHT_INPUTS = {"Conv": (1, 2), "ConvTranspose": (1, 2), "Gemm": (1, 2), "MatMul": (1,)}
MAX_FOLDED_WEIGHT_ELEMENTS = 1 << 27  # 512 MiB of float32: VGG-19's fc6 (103 M) fits


def _feeds_weights(name: str, uses: dict, depth: int = 8) -> bool:
    """Whether every use of `name` is a layer's parameter input, directly or through at most
    `depth` nodes whose outputs all are (a Cast, Reshape or Transpose of a weight)."""
    users = uses.get(name, [])
    return bool(users) and all(
        any(u.input[k] == name for k in WEIGHT_INPUTS.get(u.op_type, ()) if k < len(u.input))
        or (depth > 0 and all(_feeds_weights(o, uses, depth - 1) for o in u.output if o))
        for u in users
    )


def fold_constants(g: Graph) -> int:
    changed = 0
    uses = g.consumers()
    for node in list(g.nodes):
        if (
            node.domain not in ("", "ai.onnx")
            or node.op_type in _NONDETERMINISTIC | _CONTROL_FLOW
            or not node.input
            or any(i and i not in g.constants for i in node.input)
            or any(o in g.output_names() for o in node.output)
        ):
            continue
        if node.op_type == "ConstantOfShape" and np.prod(g.constants[node.input[0]], dtype=np.float64) > (
            MAX_FOLDED_WEIGHT_ELEMENTS
        ):
            continue  # never materialise what no limit would keep
        try:
            values = _evaluate(node, g)
        except Exception:  # an op the reference runtime lacks: leave it to onnxruntime
            continue
        largest_input = max((g.constants[i].size for i in node.input if i), default=0)
        limit = max(MAX_FOLDED_ELEMENTS, largest_input)
        if all(_feeds_weights(o, uses) for o in node.output if o):
            limit = max(limit, MAX_FOLDED_WEIGHT_ELEMENTS)
        if any(np.asarray(v).size > limit for v in values):
            continue
        for name, value in zip(node.output, values):
            if name:
                g.constants[name] = np.asarray(value)
        g.nodes.remove(node)
        changed += 1
    return changed


def _all_equal(value: np.ndarray | None, scalar: float) -> bool:
    return value is not None and value.size > 0 and bool(np.all(value == scalar))


def _noop_input(g: Graph, node: onnx.NodeProto, uses: dict) -> str | None:
    """The input a node passes through unchanged, or None."""
    op = node.op_type
    out_shape = g.shape(node.output[0])
    if op == "Identity":
        return node.input[0]
    if op == "Dropout":  # at inference: the identity, unless its mask is read or training is on
        if any(o and (o in uses or o in g.output_names()) for o in node.output[1:]):
            return None
        if len(node.input) > 2 and node.input[2]:
            training = g.constant(node.input[2])
            if training is None or bool(np.any(training)):
                return None
        return node.input[0]
    if op == "Cast":
        return node.input[0] if g.elem_type(node.input[0]) == node_attr(node, "to") else None
    if op in ("Reshape", "Expand", "Resize", "Flatten", "Squeeze", "Unsqueeze"):
        x = node.input[0]
        same = out_shape is not None and g.shape(x) == out_shape
        return x if same and x not in g.constants else None
    if op == "Transpose":
        perm = node_attr(node, "perm")
        return node.input[0] if perm is not None and list(perm) == sorted(perm) else None
    if op == "Concat" and len(node.input) == 1:
        return node.input[0]
    if op == "Pad":
        pads = g.constant(node.input[1]) if len(node.input) > 1 else np.array(node_attr(node, "pads", []))
        return node.input[0] if pads is not None and _all_equal(pads, 0) else None
    if op in ("Add", "Sub", "Mul", "Div") and len(node.input) == 2:
        neutral = 0.0 if op in ("Add", "Sub") else 1.0
        sides = [(0, 1), (1, 0)] if op in ("Add", "Mul") else [(0, 1)]
        for data, const in sides:
            x = node.input[data]
            if _all_equal(g.constant(node.input[const]), neutral) and g.shape(x) == out_shape and out_shape:
                if g.elem_type(x) == g.elem_type(node.output[0]):
                    return x
    return None


def remove_noops(g: Graph) -> int:
    changed = 0
    uses = g.consumers()
    for node in list(g.nodes):
        keep = _noop_input(g, node, uses)
        if keep is not None and g.bypass(node, keep):
            changed += 1
    return changed


def _conv_channel_axis(conv: onnx.NodeProto) -> int | None:
    """Axis of the weight tensor that indexes output channels (None: cannot fold)."""
    if conv.op_type == "Conv":
        return 0
    if conv.op_type == "ConvTranspose" and node_attr(conv, "group", 1) == 1:
        return 1
    return None


def rescale_conv(g: Graph, conv: onnx.NodeProto, scale: np.ndarray, shift: np.ndarray) -> bool:
    """conv(x) * scale + shift, folded into the conv's weight and bias (new constants)."""
    axis = _conv_channel_axis(conv)
    weight = g.constant(conv.input[1])
    bias = g.constant(conv.input[2]) if len(conv.input) > 2 and conv.input[2] else None
    if axis is None or weight is None or (len(conv.input) > 2 and conv.input[2] and bias is None):
        return False
    if weight.dtype != np.float32:
        return False
    channels = weight.shape[axis]
    if scale.shape != (channels,) or shift.shape != (channels,):
        return False
    bshape = [1] * weight.ndim
    bshape[axis] = channels
    new_w = (weight.astype(np.float64) * scale.reshape(bshape)).astype(np.float32)
    old_b = bias.astype(np.float64) if bias is not None else np.zeros(channels)
    new_b = (old_b * scale + shift).astype(np.float32)
    base = conv.name or conv.output[0]
    inputs = list(conv.input[:2]) + [""] * (3 - len(conv.input[:2]))
    inputs[1] = g.add_constant(f"{base}.weight", new_w)
    inputs[2] = g.add_constant(f"{base}.bias", new_b)
    del conv.input[:]
    conv.input.extend(inputs)
    return True


def fold_batchnorm(g: Graph) -> int:
    changed = 0
    producers = g.producers()
    for bn in list(g.nodes):
        if bn.op_type != "BatchNormalization" or any(o for o in bn.output[1:]):
            continue
        conv = producers.get(bn.input[0])
        if conv is None or conv.op_type not in ("Conv", "ConvTranspose") or not _single_use(g, bn.input[0]):
            continue
        affine = bn_affine(g, bn)
        if affine is not None and rescale_conv(g, conv, *affine) and g.bypass(bn, bn.input[0]):
            changed += 1
            producers = g.producers()
    return changed


def fold_scale_into_conv(g: Graph) -> int:
    changed = 0
    producers = g.producers()
    for node in list(g.nodes):
        if node.op_type not in ("Mul", "Div", "Add", "Sub") or len(node.input) != 2:
            continue
        sides = [(0, 1), (1, 0)] if node.op_type in ("Mul", "Add") else [(0, 1)]
        for data, const in sides:
            conv = producers.get(node.input[data])
            value = g.constant(node.input[const])
            if conv is None or conv.op_type not in ("Conv", "ConvTranspose") or value is None:
                continue
            out_shape = g.shape(node.input[data])
            if (
                out_shape is None
                or not _single_use(g, node.input[data])
                or g.shape(node.output[0]) != out_shape
            ):
                continue
            vec = per_channel(value, out_shape[1], len(out_shape))
            if vec is None or (node.op_type == "Div" and np.any(vec == 0)):
                continue
            scale, shift = affine_terms(node.op_type, vec)
            if rescale_conv(g, conv, scale, shift) and g.bypass(node, node.input[data]):
                changed += 1
                producers = g.producers()
                break
    return changed


def cancel_transpose_reshape(g: Graph) -> int:
    changed = 0
    producers = g.producers()
    for node in list(g.nodes):
        if node not in g.nodes:
            continue
        inner = producers.get(node.input[0]) if node.input else None
        if inner is None or inner.op_type != node.op_type or not _single_use(g, inner.output[0]):
            continue
        if node.op_type == "Transpose":
            p1, p2 = node_attr(inner, "perm"), node_attr(node, "perm")
            if p1 is None or p2 is None:
                continue
            combined = [p1[i] for i in p2]
            node.input[0] = inner.input[0]
            g.nodes.remove(inner)
            if combined == sorted(combined):
                g.bypass(node, node.input[0])
            else:
                del node.attribute[:]
                node.attribute.append(helper.make_attribute("perm", combined))
            changed += 1
        elif node.op_type == "Reshape":
            target = g.constant(node.input[1])
            if target is None or np.any(target == 0):
                continue
            node.input[0] = inner.input[0]
            g.nodes.remove(inner)
            changed += 1
        producers = g.producers()
    return changed


def _function(name: str, body: list[onnx.NodeProto], opset: int) -> onnx.FunctionProto:
    return helper.make_function(NPUBUILD_DOMAIN, name, ["X"], ["Y"], body, [helper.make_opsetid("", opset)])


def _silu_function(opset: int) -> onnx.FunctionProto:
    return _function(
        "SiLU", [helper.make_node("Sigmoid", ["X"], ["S"]), helper.make_node("Mul", ["X", "S"], ["Y"])], opset
    )


def _hardswish_function(opset: int) -> onnx.FunctionProto:
    body = [
        helper.make_node("HardSigmoid", ["X"], ["S"], alpha=1.0 / 6, beta=0.5),
        helper.make_node("Mul", ["X", "S"], ["Y"]),
    ]
    return _function("HardSwish", body, opset)


def _fuse(g: Graph, name: str, x: str, matched: list[onnx.NodeProto], function: onnx.FunctionProto) -> None:
    last = matched[-1]
    fused = helper.make_node(
        name, [x], [last.output[0]], name=last.name or last.output[0], domain=NPUBUILD_DOMAIN
    )
    g.use_function(function)
    g.replace_node(matched, fused)


def fuse_silu(g: Graph) -> int:
    """x * sigmoid(x) -> SiLU(x), kept runnable as a model-local ONNX function."""
    changed = 0
    producers = g.producers()
    for mul in list(g.nodes):
        if mul.op_type != "Mul" or len(mul.input) != 2:
            continue
        for a, b in ((0, 1), (1, 0)):
            sig = producers.get(mul.input[b])
            if (
                sig is not None
                and sig.op_type == "Sigmoid"
                and sig.input[0] == mul.input[a]
                and _single_use(g, sig.output[0])
            ):
                _fuse(g, "SiLU", mul.input[a], [sig, mul], _silu_function(g.opset))
                changed += 1
                producers = g.producers()
                break
    return changed


def _relu6_of_x_plus_3(g: Graph, name: str, producers: dict) -> tuple[str, list] | None:
    """Match Clip(Add(x, 3), 0, 6) (or Relu6 via Clip attributes); returns x and the nodes."""
    clip = producers.get(name)
    if clip is None or clip.op_type != "Clip":
        return None
    lo = g.scalar(clip.input[1]) if len(clip.input) > 1 and clip.input[1] else node_attr(clip, "min")
    hi = g.scalar(clip.input[2]) if len(clip.input) > 2 and clip.input[2] else node_attr(clip, "max")
    add = producers.get(clip.input[0])
    if lo != 0 or hi != 6 or add is None or add.op_type != "Add" or not _single_use(g, add.output[0]):
        return None
    for a, b in ((0, 1), (1, 0)):
        if g.scalar(add.input[b]) == 3.0:
            return add.input[a], [add, clip]
    return None


def fuse_hardswish(g: Graph) -> int:
    """x * hardsigmoid(x) and x * relu6(x + 3) / 6 -> HardSwish(x)."""
    changed = 0
    producers = g.producers()
    for node in list(g.nodes):
        if node not in g.nodes:
            continue
        match = _match_hardswish(g, node, producers)
        if match is not None:
            x, matched = match
            _fuse(g, "HardSwish", x, matched, _hardswish_function(g.opset))
            changed += 1
            producers = g.producers()
    return changed


def _match_hardswish(g: Graph, node: onnx.NodeProto, producers: dict) -> tuple[str, list] | None:
    if node.op_type == "Mul" and len(node.input) == 2:
        for a, b in ((0, 1), (1, 0)):
            hs = producers.get(node.input[b])
            if (
                hs is not None
                and hs.op_type == "HardSigmoid"
                and hs.input[0] == node.input[a]
                and abs(node_attr(hs, "alpha", 0.2) - 1 / 6) < 1e-6
                and node_attr(hs, "beta", 0.5) == 0.5
                and _single_use(g, hs.output[0])
            ):
                return node.input[a], [hs, node]
    # (x * relu6(x + 3)) / 6  or  (x * relu6(x + 3)) * (1/6)
    if node.op_type in ("Div", "Mul") and len(node.input) == 2:
        divisor = g.scalar(node.input[1])
        if divisor is None or not np.isclose(
            divisor if node.op_type == "Div" else 1 / divisor, 6.0, rtol=1e-6
        ):
            return None
        mul = producers.get(node.input[0])
        if mul is None or mul.op_type != "Mul" or not _single_use(g, mul.output[0]):
            return None
        for a, b in ((0, 1), (1, 0)):
            relu6 = _relu6_of_x_plus_3(g, mul.input[b], producers)
            if relu6 is not None and relu6[0] == mul.input[a] and _single_use(g, mul.input[b]):
                return mul.input[a], [*relu6[1], mul, node]
    return None


def _signature(node: onnx.NodeProto) -> tuple:
    attrs = tuple(sorted((a.name, a.SerializeToString(deterministic=True)) for a in node.attribute))
    return (node.domain, node.op_type, tuple(node.input), attrs, len(node.output))


def eliminate_common_subexpressions(g: Graph) -> int:
    changed = 0
    # Identical small constants first, so nodes reading them become identical too.
    seen_constants: dict[tuple, str] = {}
    for name in list(g.constants):
        value = g.constants[name]
        if value.size > 4096 or name in g.output_names():
            continue
        sig = (value.dtype.str, value.shape, value.tobytes())
        if sig in seen_constants:
            g.replace_uses(name, seen_constants[sig])
            del g.constants[name]
            changed += 1
        else:
            seen_constants[sig] = name
    seen: dict[tuple, onnx.NodeProto] = {}
    outputs = g.output_names()
    for node in list(g.nodes):
        if node.op_type in _NONDETERMINISTIC or node.op_type in _CONTROL_FLOW:
            continue
        sig = _signature(node)
        first = seen.get(sig)
        if first is None:
            seen[sig] = node
            continue
        if any(o in outputs for o in node.output):
            continue
        for mine, theirs in zip(node.output, first.output):
            if mine:
                g.replace_uses(mine, theirs)
        g.nodes.remove(node)
        changed += 1
    return changed


def eliminate_dead_code(g: Graph) -> int:
    live = set(g.output_names())
    kept: list[onnx.NodeProto] = []
    for node in reversed(g.nodes):
        if any(o in live for o in node.output):
            kept.append(node)
            live.update(i for i in node.input if i)
    removed = len(g.nodes) - len(kept)
    g.nodes = list(reversed(kept))
    dead_constants = [k for k in g.constants if k not in live]
    for k in dead_constants:
        del g.constants[k]
    return removed


PASSES: dict[str, Callable[[Graph], int]] = {
    f.__name__: f
    for f in (
        dequantize_qoperator,
        absorb_qdq,
        constants_to_initializers,
        fold_shapes,
        fold_constants,
        remove_noops,
        sum_to_add,
        decompose_lrn,
        fuse_layernorm,
        fuse_gelu,
        fold_batchnorm,
        batchnorm_to_affine,
        merge_untouched_axes,
        squeeze_unit_axes,
        conv1d_as_2d,
        unit_transposes_as_reshapes,
        transposes_through_elementwise,
        clamps_before_moves,
        pools_before_widening_convs,
        softmax_to_last_axis,
        linear_resize_as_matmuls,
        fold_scale_into_conv,
        matmul_bias_as_gemm,
        cancel_transpose_reshape,
        fuse_silu,
        fuse_hardswish,
        merge_affines,
        eliminate_common_subexpressions,
        eliminate_dead_code,
    )
}
