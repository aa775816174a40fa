"""Encoding the ops whose integer form is a table or a row reduction: element-wise functions
tabulated by running the node itself on every input code, Softmax (an exponent table) and
LayerNormalization (per-element multipliers). Semantics in npubuild/intmodel/rowwise.py."""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import helper, numpy_helper

from npubuild.intmodel.codes import qrange
from npubuild.intmodel.fixedpoint import quantize_multiplier
from npubuild.intmodel.lut import lut_function
from npubuild.intmodel.ops import LUT_OPS
from npubuild.intmodel.rowwise import EPS_CODES_MAX, Z_FRACTION_BITS, exp_table
from npubuild.stages.onnx_utils import node_attributes


def data_input(node: onnx.NodeProto, constants: dict) -> str:
    """The one input of an element-wise function that is not a constant."""
    return next(i for i in node.input if i and i not in constants)


def evaluate_node(node: onnx.NodeProto, model: onnx.ModelProto, constants: dict, x: str, value) -> np.ndarray:
    """The node's float32 output for `value` as its data input, by onnx's reference runtime:
    a tabulated op means exactly what the ONNX op (or npubuild function) means."""
    from onnx.reference import ReferenceEvaluator

    inits = [numpy_helper.from_array(np.asarray(constants[i]), i) for i in node.input if i and i != x]
    graph = helper.make_graph(
        [node],
        "table",
        [helper.make_tensor_value_info(x, onnx.TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info(node.output[0], onnx.TensorProto.FLOAT, None)],
        inits,
    )
    tiny = helper.make_model(graph, opset_imports=list(model.opset_import))
    tiny.functions.extend(model.functions)
    with np.errstate(over="ignore", under="ignore"):  # Sigmoid's exp over a table's far ends
        (y,) = ReferenceEvaluator(tiny).run(None, {x: value})
    return np.asarray(y, np.float32)


# The table of a fine pre-activation (a 16-bit convolution result whose range was chosen for 1,024
# steps) has one entry per 64 neighbouring codes, the function at their middle: 1,024 entries (1
# or 2 KiB) fit a convolution's output path where 65,536 do not, and cost little DRAM traffic
# (docs/quantization.md, "Fine pre-activations": 12 bits measured no better on the validation
# split and doubled a small model's table traffic). Any other table has an entry per code.
WIDE_INPUT_SHIFT = 6


def table_op(enc, node: onnx.NodeProto) -> dict:
    """A `lut` op whose table is the function at every code of its input (at the middle of each
    run of 2^shift codes for a shifted table): the activations of LUT_OPS by their float32
    definitions (intmodel/lut.py), any other node evaluated as itself."""
    x, out = data_input(node, enc.constants), node.output[0]
    xp = enc.params[x]
    qmin, qmax = qrange(xp.bits)
    codes = np.arange(qmin, qmax + 1, dtype=np.float64)
    shift = WIDE_INPUT_SHIFT if x in enc.fine_preactivations else 0
    table = _table(enc, node, codes[:: 1 << shift] + ((1 << shift) - 1) / 2)
    return {
        "kind": "lut",
        "op_type": node.op_type,
        "inputs": [x],
        "outputs": [out],
        "attrs": {"offset": -qmin, **({"index_shift": shift} if shift else {})},  # (no shift: as before)
        "table": table,
    }


def activation_function(node: onnx.NodeProto):
    """The float function of a lookup-table activation node (LUT_OPS), its attributes applied:
    what its table is built from, and what the quantizer and evaluate judge clipping through."""
    return lut_function(node.op_type, node_attributes(node))


def _table(enc, node: onnx.NodeProto, codes: np.ndarray) -> np.ndarray:
    """The output codes of the function at input `codes` (any real position on the input grid)."""
    x, out = data_input(node, enc.constants), node.output[0]
    xp, yp = enc.params[x], enc.params[out]
    real = ((codes - xp.zero_point) * xp.scale).astype(np.float32)
    if node.op_type in LUT_OPS:
        y = activation_function(node)(real).astype(np.float32)
    else:
        with np.errstate(all="ignore"):
            y = evaluate_node(node, enc.model, enc.constants, x, real)
    y = y.astype(np.float64).reshape(-1)
    # a per-channel result: 16-bit entries on its base grid, which each channel shifts right
    oqmin, oqmax = qrange(16 if yp.channel_shifts else yp.bits)
    # outside a function's domain: -inf and +inf (log of 0) the extreme codes, NaN (log or sqrt of
    # a negative value) the code of 0
    y = np.nan_to_num(y, nan=0.0, posinf=oqmax * yp.scale * 2, neginf=oqmin * yp.scale * 2)
    return np.clip(np.rint(y / yp.scale) + yp.zero_point, oqmin, oqmax).astype(np.int32)


def softmax_op(enc, node: onnx.NodeProto) -> dict:
    x, out = node.input[0], node.output[0]
    xp = enc.params[x]
    table, rshift = exp_table(xp.scale, xp.bits)
    return {
        "kind": "softmax",
        "op_type": node.op_type,
        "inputs": [x],
        "outputs": [out],
        "attrs": {"rshift": rshift},
        "table": table.astype(np.int32),
    }


def layernorm_parts(node: onnx.NodeProto, constants: dict) -> tuple[np.ndarray, np.ndarray, float]:
    """(gamma, beta, epsilon) of LayerNormalization(X, Scale[, B]) or npubuild's LayerNorm(X,
    Scale, B, Epsilon)."""
    gamma = np.asarray(constants[node.input[1]], np.float64).reshape(-1)
    beta = (
        np.asarray(constants[node.input[2]], np.float64).reshape(-1)
        if len(node.input) > 2 and node.input[2]
        else np.zeros(1)
    )
    if node.op_type == "LayerNorm":
        eps = float(np.asarray(constants[node.input[3]]).reshape(-1)[0])
    else:
        eps = next((a.f for a in node.attribute if a.name == "epsilon"), 1e-5)
    return gamma, beta, eps


def layernorm_op(enc, node: onnx.NodeProto, n: int) -> dict:
    x, out = node.input[0], node.output[0]
    xp, yp = enc.params[x], enc.params[out]
    gamma, beta, eps = layernorm_parts(node, enc.constants)
    gamma, beta = np.broadcast_to(gamma, (n,)), np.broadcast_to(beta, (n,))
    params = np.zeros((n, 3), np.int64)
    for i in range(n):
        m0, shift = quantize_multiplier(abs(gamma[i]) / (yp.scale * (1 << Z_FRACTION_BITS)))
        params[i] = (int(math.copysign(m0, gamma[i])), shift, int(np.rint(beta[i] / yp.scale)))
    eps_codes = int(min(max(round(n * n * eps / (xp.scale * xp.scale)), 1), EPS_CODES_MAX))
    return {
        "kind": "layernorm",
        "op_type": node.op_type,
        "inputs": [x],
        "outputs": [out],
        "attrs": {"eps_codes": eps_codes},
        "params": params,
    }
