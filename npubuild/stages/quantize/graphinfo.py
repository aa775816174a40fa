"""The facts of a graph the planner reads and that no setting changes: shapes, readers and
producers, which tensors no grid can stand for and why, the photo input. Computed once per model
and shared by every plan of it (a precision search plans a thousand)."""

from __future__ import annotations

from dataclasses import dataclass

import onnx
from onnx import TensorProto, helper, numpy_helper

from npubuild.stages.onnx_utils import tensor_readers

FUSED_HEAD = "fused_preprocess"  # the node fuse_preprocess puts in front (stages/fuse.py)


@dataclass(frozen=True)
class GraphInfo:
    """What does not depend on the settings."""

    # the graph's nodes, held: plans key their choices by id(node), and python-protobuf makes a
    # new wrapper object per access for an element nobody holds, reusing a freed one's id (five
    # input-less nodes, one pass: two distinct ids)
    nodes: tuple[onnx.NodeProto, ...]
    constants: dict
    shapes: dict[str, list[int]]
    consumers: dict[str, list[onnx.NodeProto]]
    producers: dict[str, onnx.NodeProto]
    outputs: frozenset[str]
    image_inputs: frozenset[str]  # the one float network input a photo data set can feed, if so
    fused_head: str | None  # the output of fuse_preprocess's head: the photo, normalised
    stays_float: dict[str, str]  # tensor -> why no grid can stand for it

    @classmethod
    def of(cls, graph: onnx.GraphProto) -> GraphInfo:
        nodes = tuple(graph.node)
        constants = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
        values = [*graph.input, *graph.value_info, *graph.output]
        shapes = {
            v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
            for v in values
            if v.type.tensor_type.HasField("shape")
        }
        floats = (TensorProto.FLOAT, TensorProto.FLOAT16)
        stays_float = {o: "no static shape" for n in nodes for o in n.output if o and o not in shapes}
        stays_float |= {  # grids stand in for float32 values only
            v.name: "float64 or integer data stays float"
            for v in values
            if v.type.tensor_type.elem_type not in floats
        }
        consumers = tensor_readers(nodes)
        producers = {o: n for n in nodes for o in n.output}
        float_inputs = [
            v.name for v in graph.input if v.name not in constants and v.type.tensor_type.elem_type in floats
        ]
        image_inputs = frozenset(float_inputs if len(float_inputs) == 1 else [])
        head = next((n.output[0] for n in nodes if n.name == FUSED_HEAD), None)
        outputs = frozenset(o.name for o in graph.output)
        return cls(
            nodes,
            constants,
            shapes,
            consumers,
            producers,
            outputs,
            image_inputs,
            head,
            stays_float,
        )


def attr(node: onnx.NodeProto, name: str, default=None):
    for a in node.attribute:
        if a.name == name:
            value = helper.get_attribute_value(a)
            return value.decode() if isinstance(value, bytes) else value
    return default


def node_label(node: onnx.NodeProto) -> str:
    return node.name or node.output[0]
