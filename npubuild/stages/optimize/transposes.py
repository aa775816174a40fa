"""Layout passes: Transposes that move no element, and Transposes that element-wise ops can
do without. Each is a relayout of a whole map through SRAM on the NPU (a copy per tile), so one
fewer is one fewer pass of the DMA over the map."""

from __future__ import annotations

import numpy as np
import onnx

from npubuild.stages.optimize.graph import Graph, node_attr


def unit_transposes_as_reshapes(g: Graph) -> int:
    """A Transpose that moves only axes of size 1 leaves every element where it was: it is a
    Reshape (a free view) to its output's shape, not a data move. conv1d_as_2d makes one of a
    single-channel input ([N, 1, L] -> [1, N, L]: Silero VAD's STFT convolution, whose input
    otherwise went through SRAM twice before the array could start)."""
    changed = 0
    for node in list(g.nodes):
        if node.op_type != "Transpose" or not node.input:
            continue
        shape, perm = g.shape(node.input[0]), node_attr(node, "perm")
        if shape is None or perm is None or len(perm) != len(shape):
            continue
        moved = [axis for axis in perm if shape[axis] != 1]
        if moved != sorted(moved):
            continue
        out_shape = [int(shape[axis]) for axis in perm]
        reshape = onnx.helper.make_node(
            "Reshape",
            [node.input[0], g.add_constant(f"{node.output[0]}.shape", np.array(out_shape, np.int64))],
            [node.output[0]],
            name=node.name or node.output[0],
        )
        g.nodes[g.nodes.index(node)] = reshape
        changed += 1
    return changed


# Ops that compute each element from the same element of their inputs (with a one-element
# constant as the other operand of a binary one): a Transpose commutes with them
ELEMENTWISE = frozenset(
    {
        "Relu",
        "Sigmoid",
        "Tanh",
        "Abs",
        "Neg",
        "Exp",
        "Log",
        "Sqrt",
        "Reciprocal",
        "Erf",
        "Clip",
        "HardSigmoid",
        "HardSwish",
        "LeakyRelu",
        "Pow",
        "Add",
        "Sub",
        "Mul",
        "Div",
        "Max",
        "Min",
    }
)


def transposes_through_elementwise(g: Graph) -> int:
    """A Transpose whose result goes only through element-wise ops and Slices (with constant
    bounds) into Transposes that undo it: the region computes the same in the untransposed
    layout, its Slices on the permuted axes, and both kinds of Transpose go. conv1d_as_2d puts
    one after a 1-D convolution and its inverse before the next: Silero VAD's magnitude spectrum
    (Slices of the STFT's real and imaginary halves, Pow, Add, Sqrt) sat between two, each a
    relayout of the whole map through SRAM on the NPU."""
    changed = 0
    for node in list(g.nodes):
        if node.op_type != "Transpose" or node not in g.nodes:
            continue
        region = _transposed_region(g, node)
        if region is None:
            continue
        perm, closing, inner = region
        source = node.input[0]
        g.replace_uses(node.output[0], source)
        g.nodes.remove(node)
        for n in inner:
            if n.op_type == "Slice":
                rank = len(perm)
                axes = g.constant(n.input[3]) if len(n.input) > 3 and n.input[3] else None
                axes = range(len(g.constant(n.input[1]))) if axes is None else axes
                moved = g.add_constant(
                    f"{n.output[0]}.axes", np.array([perm[int(a) % rank] for a in axes], np.int64)
                )
                if len(n.input) > 3:
                    n.input[3] = moved
                else:
                    n.input.append(moved)
            for o in n.output:
                elem, shape = g.types.get(o, (0, None))
                if shape is not None:
                    g.types[o] = (elem, tuple(shape[perm.index(k)] for k in range(len(perm))))
        for t in closing:
            g.bypass(t, t.input[0])
        changed += 1
    return changed


def _transposed_region(g: Graph, transpose: onnx.NodeProto):
    """(perm, the closing Transposes, the ops between in graph order) where `transpose`'s result
    reaches only element-wise ops and constant Slices whose results reach only each other and
    Transposes by its inverse; None otherwise."""
    perm = node_attr(transpose, "perm")
    shape = g.shape(transpose.input[0])
    if perm is None or shape is None or len(perm) != len(shape):
        return None
    perm = [int(p) for p in perm]
    inverse = [perm.index(k) for k in range(len(perm))]
    uses, outputs = g.consumers(), g.output_names()
    inner: list[onnx.NodeProto] = []
    closing: list[onnx.NodeProto] = []
    made = {transpose.output[0]}  # results in the transposed layout
    pending = [transpose.output[0]]
    while pending:
        name = pending.pop()
        if name in outputs:
            return None
        for n in uses.get(name, []):
            if n in inner or n in closing:
                continue
            if n.op_type == "Transpose" and [int(p) for p in node_attr(n, "perm") or []] == inverse:
                closing.append(n)
                continue
            if n.op_type != "Slice" and n.op_type not in ELEMENTWISE:
                return None
            inner.append(n)
            made.update(n.output)
            pending.extend(n.output)
    # (an op of two region inputs is reached from the first before the second is made)
    if not closing or not inner or not all(_layout_free(g, n, made, len(perm)) for n in inner):
        return None
    return perm, closing, [n for n in g.nodes if n in inner]  # in graph order


def _layout_free(g: Graph, n: onnx.NodeProto, made: set[str], rank: int) -> bool:
    """Whether `n` computes the same on a transposed input: an element-wise op whose every
    input is a result of the region, or a one-element constant; or a Slice of a region result
    with constant bounds (its axes then permute)."""
    if len(n.output) != 1:
        return False
    if n.op_type == "Slice":
        if len(n.input) < 3 or n.input[0] not in made:
            return False
        return all(g.constant(i) is not None for i in n.input[1:] if i)
    if n.op_type not in ELEMENTWISE or n.domain not in ("", "ai.onnx"):
        return False
    for i in n.input:
        if not i:
            continue
        value = g.constant(i)
        if i not in made and (value is None or value.size != 1):
            return False
        if value is not None and value.ndim > rank:
            return False
    shape = g.shape(n.output[0])
    return shape is not None and len(shape) == rank
