"""A mutable view of an ONNX graph for the passes: nodes, constant tensors, shapes, use lists."""

from __future__ import annotations

import json

import numpy as np
import onnx
from onnx import helper, numpy_helper

from npubuild.stages.onnx_utils import default_opset, set_types, tensor_readers

NPUBUILD_DOMAIN = "npubuild"
QDQ_METADATA = "npubuild.qdq"  # the grids of a pre-quantized model's activations (prequantized.py)


class Graph:
    def __init__(self, model: onnx.ModelProto):
        # Passes edit nodes in place; work on a copy so the caller's model stays the reference.
        self.model = onnx.ModelProto()
        self.model.CopyFrom(model)
        g = self.model.graph
        self.nodes: list[onnx.NodeProto] = list(g.node)
        self.constants: dict[str, np.ndarray] = {t.name: numpy_helper.to_array(t) for t in g.initializer}
        self.inputs = [i for i in g.input if i.name not in self.constants]
        self.outputs = list(g.output)
        self.opset = default_opset(model)
        self.functions: dict[str, onnx.FunctionProto] = {f.name: f for f in model.functions}
        self.types: dict[str, tuple[int, tuple[int, ...] | None]] = {}
        self._read_types(g)
        self._counter = 0
        # tensor -> the grid a pre-quantized model's Q/DQ pair gave it (prequantized.py)
        self.qdq: dict[str, dict] = recorded_grids(model)

    # types and shapes -------------------------------------------------------------------------
    def _read_types(self, g: onnx.GraphProto) -> None:
        for v in [*g.input, *g.value_info, *g.output]:
            t = v.type.tensor_type
            shape = None
            if t.HasField("shape") and all(d.HasField("dim_value") for d in t.shape.dim):
                shape = tuple(d.dim_value for d in t.shape.dim)
            self.types[v.name] = (t.elem_type, shape)

    def shape(self, name: str) -> tuple[int, ...] | None:
        if name in self.constants:
            return tuple(self.constants[name].shape)
        return self.types.get(name, (0, None))[1]

    def elem_type(self, name: str) -> int:
        if name in self.constants:
            return onnx.helper.np_dtype_to_tensor_dtype(self.constants[name].dtype)
        return self.types.get(name, (0, None))[0]

    def refresh_types(self) -> None:
        """Re-run onnx shape inference on the current graph (after passes changed it)."""
        inferred = onnx.shape_inference.infer_shapes(self.to_model(keep_value_info=True), data_prop=True)
        self._read_types(inferred.graph)

    def restore_shapes(self, model: onnx.ModelProto) -> None:
        """Give `model` (this graph, re-inferred from scratch) the shapes onnx's inference cannot
        derive but the graph knows: import read them from a run in onnxruntime (outputs of
        com.microsoft ops, data-dependent Reshapes). Without them planning takes such a tensor
        for a scalar."""
        g = model.graph
        shaped = {v.name for v in [*g.value_info, *g.output] if v.type.tensor_type.HasField("shape")}
        missing = [o for n in g.node for o in n.output if o and o not in shaped]
        recorded = {name: self.types[name] for name in missing if name in self.types}
        set_types(g, {name: t for name, t in recorded.items() if t[0] and t[1] is not None})

    # use lists --------------------------------------------------------------------------------
    def producers(self) -> dict[str, onnx.NodeProto]:
        return {o: n for n in self.nodes for o in n.output if o}

    def consumers(self) -> dict[str, list[onnx.NodeProto]]:
        return tensor_readers(self.nodes)

    def output_names(self) -> set[str]:
        return {o.name for o in self.outputs}

    def input_names(self) -> set[str]:
        return {i.name for i in self.inputs}

    def constant(self, name: str) -> np.ndarray | None:
        return self.constants.get(name)

    def scalar(self, name: str) -> float | None:
        """The value of a one-element constant, else None."""
        value = self.constants.get(name)
        return float(value.reshape(-1)[0]) if value is not None and value.size == 1 else None

    def fresh_name(self, base: str) -> str:
        while True:
            self._counter += 1
            name = f"{base}__{self._counter}"
            if name not in self.constants and name not in self.types:
                return name

    def add_constant(self, base: str, value: np.ndarray) -> str:
        name = self.fresh_name(base)
        self.constants[name] = value
        return name

    # rewiring ---------------------------------------------------------------------------------
    def replace_uses(self, old: str, new: str) -> None:
        for n in self.nodes:
            for k, i in enumerate(n.input):
                if i == old:
                    n.input[k] = new

    def bypass(self, node: onnx.NodeProto, keep: str) -> bool:
        """Remove a node whose output equals its input `keep`. False when that is not possible."""
        out = node.output[0]
        if out not in self.output_names():
            self.replace_uses(out, keep)
            self.nodes.remove(node)
            return True
        producer = self.producers().get(keep)
        if producer is None or keep in self.output_names() or len(self.consumers().get(keep, [])) != 1:
            return False
        # `out` must keep its name (a graph output): the producer of `keep` takes it over.
        producer.output[list(producer.output).index(keep)] = out
        if keep in self.qdq:
            self.qdq[out] = self.qdq.pop(keep)
        self.types[out] = self.types.get(keep, self.types.get(out, (0, None)))
        self.nodes.remove(node)
        return True

    def replace_node(self, old: list[onnx.NodeProto], new: onnx.NodeProto) -> None:
        """Put `new` where the first of `old` stood and drop the rest of `old`."""
        index = min(self.nodes.index(n) for n in old)
        for n in old:
            self.nodes.remove(n)
        self.nodes.insert(index, new)

    def use_function(self, function: onnx.FunctionProto) -> None:
        self.functions.setdefault(function.name, function)

    # back to a model --------------------------------------------------------------------------
    def to_model(self, keep_value_info: bool = False) -> onnx.ModelProto:
        used = {i for n in self.nodes for i in n.input} | self.output_names()
        initializers = [numpy_helper.from_array(v, k) for k, v in self.constants.items() if k in used]
        value_info = []
        if keep_value_info:
            produced = {o for n in self.nodes for o in n.output}
            for name in produced - self.output_names():
                elem, shape = self.types.get(name, (0, None))
                if elem and shape is not None:
                    value_info.append(helper.make_tensor_value_info(name, elem, list(shape)))
            value_info.sort(key=lambda v: v.name)
        graph = helper.make_graph(
            self.nodes, self.model.graph.name, self.inputs, self.outputs, initializers, value_info=value_info
        )
        opsets = [o for o in self.model.opset_import if o.domain != NPUBUILD_DOMAIN]
        if any(n.domain == NPUBUILD_DOMAIN for n in self.nodes):
            opsets.append(helper.make_opsetid(NPUBUILD_DOMAIN, 1))
        used_functions = {n.op_type for n in self.nodes if n.domain == NPUBUILD_DOMAIN}
        model = helper.make_model(
            graph,
            opset_imports=opsets,
            ir_version=self.model.ir_version,
            producer_name=self.model.producer_name,
            producer_version=self.model.producer_version,
            functions=[f for name, f in sorted(self.functions.items()) if name in used_functions],
        )
        kept = {k: v for k, v in sorted(self.qdq.items()) if k in self.types or k in self.output_names()}
        if kept:
            onnx.helper.set_model_props(model, {QDQ_METADATA: json.dumps(kept, sort_keys=True)})
        return model


def recorded_grids(model: onnx.ModelProto) -> dict[str, dict]:
    """The grids absorb_qdq recorded in a model's metadata ({} for a float model)."""
    for prop in model.metadata_props:
        if prop.key == QDQ_METADATA:
            return json.loads(prop.value)
    return {}


def node_attr(node: onnx.NodeProto, name: str, default=None):
    """A node's attribute value, or `default` when it has none."""
    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default
