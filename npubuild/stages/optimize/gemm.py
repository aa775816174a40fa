"""A matrix product and the bias added to it, as one Gemm."""

from __future__ import annotations

import numpy as np
import onnx

from npubuild.stages.optimize.canonical import _reshaped, _single_use
from npubuild.stages.optimize.graph import Graph


def _bias_of(g: Graph, add: onnx.NodeProto, producers: dict) -> tuple[onnx.NodeProto, int] | None:
    """(the MatMul, the index of the constant among the Add's inputs) where `add` adds a constant of
    one value per column to the product of a MatMul by a constant float matrix, and nothing else
    reads that product."""
    shape = g.shape(add.output[0])
    if add.op_type != "Add" or len(add.input) != 2 or not shape or 0 in shape:
        return None
    for data, const in ((0, 1), (1, 0)):
        matmul, bias = producers.get(add.input[data]), g.constant(add.input[const])
        weight = g.constant(matmul.input[1]) if matmul is not None and matmul.op_type == "MatMul" else None
        if (
            weight is not None
            and weight.ndim == 2
            and weight.dtype == np.float32
            and bias is not None
            and bias.size == shape[-1]
            and bias.shape[-1:] == (shape[-1],)
            and g.shape(add.input[data]) == shape
            and _single_use(g, add.input[data])
        ):
            return matmul, const
    return None


def matmul_bias_as_gemm(g: Graph) -> int:
    """x @ W + b, W a constant matrix and b a constant of one value per column -> Gemm(x, W, b),
    between Reshapes (free views) to and from [rows, K] where x has more than two axes. The
    integer matrix product adds its bias in the 32-bit accumulator, so the result is rounded once;
    as a MatMul and an Add, the product is first rounded to an int8 grid of its own and the bias to
    the sum's (ViT-S: 72 such pairs)."""
    changed = 0
    producers = g.producers()
    for add in list(g.nodes):
        found = _bias_of(g, add, producers) if g.elem_type(add.output[0]) == onnx.TensorProto.FLOAT else None
        x_shape = g.shape(found[0].input[0]) if found else None
        if not x_shape or len(x_shape) < 2:
            continue
        matmul, k = found
        base = matmul.name or matmul.output[0]
        bias = g.add_constant(f"{base}.bias", g.constant(add.input[k]).reshape(-1))
        if len(x_shape) == 2:
            nodes = [
                onnx.helper.make_node(
                    "Gemm", [matmul.input[0], matmul.input[1], bias], [add.output[0]], name=base
                )
            ]
        else:
            rows, shape = int(np.prod(x_shape[:-1])), g.shape(add.output[0])
            before, flat = _reshaped(g, matmul.input[0], [rows, x_shape[-1]], "rows")
            product = g.fresh_name(f"{add.output[0]}_rows")
            after = onnx.helper.make_node(
                "Reshape",
                [product, g.add_constant(f"{product}.shape", np.array(shape, np.int64))],
                [add.output[0]],
                name=f"{base}_unrows",
            )
            gemm = onnx.helper.make_node("Gemm", [flat, matmul.input[1], bias], [product], name=base)
            nodes = [before, gemm, after]
            g.types[flat] = (onnx.TensorProto.FLOAT, (rows, x_shape[-1]))
            g.types[product] = (onnx.TensorProto.FLOAT, (rows, shape[-1]))
        index = g.nodes.index(matmul)
        g.nodes.remove(add)
        g.nodes[index : index + 1] = nodes
        changed += 1
        producers = g.producers()
    return changed
