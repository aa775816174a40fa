"""CPU subgraphs: the integer-model ops the NPU does not run, as one ONNX model each.

Float ops are their original node. An integer op the target lacks runs as QDQ: its inputs are
dequantized, its original float nodes run, its outputs are quantized with the integer model's
parameters (onnxruntime's Q/DQ; int16 through the com.microsoft domain). A quantize op is a
QuantizeLinear. Values keep their state across the boundary: integer codes stay codes (int8 or
int16 arrays), float values stay float32.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from npubuild.intmodel.codes import qdq_grid
from npubuild.intmodel.program import IntegerModel, Op

Q_TYPES = {8: TensorProto.INT8, 16: TensorProto.INT16}


def _nodes_between(model: onnx.ModelProto, inputs: list[str], outputs: list[str]) -> list[onnx.NodeProto]:
    producers = {o: n for n in model.graph.node for o in n.output}
    stop = set(inputs) | {t.name for t in model.graph.initializer}
    found: dict[int, onnx.NodeProto] = {}
    stack = [o for o in outputs]
    while stack:
        name = stack.pop()
        if name in stop or name not in producers:
            continue
        node = producers[name]
        if id(node) in found:
            continue
        found[id(node)] = node
        stack.extend(i for i in node.input if i)
    order = {id(n): k for k, n in enumerate(model.graph.node)}
    return sorted(found.values(), key=lambda n: order[id(n)])


class CpuSubgraph:
    def __init__(self, model: onnx.ModelProto, program: IntegerModel, arrays: dict, index: int):
        self.model, self.program, self.arrays = model, program, arrays
        self.tensors = program.tensors
        self.prefix = f"cpu{index}::"
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: dict[str, onnx.TensorProto] = {}
        self.inputs: list[dict] = []
        self.current: dict[str, tuple[str, str]] = {}  # tensor -> (value name, "f" | "q")
        self.model_inits = {t.name: t for t in model.graph.initializer}
        # a float-state value has its own ONNX type: float, or an integer (token ids, shapes)
        self.elem_types = {
            v.name: v.type.tensor_type.elem_type or TensorProto.FLOAT
            for v in [*model.graph.input, *model.graph.value_info, *model.graph.output]
        }
        self.count = 0

    def _fresh(self, base: str) -> str:
        self.count += 1
        return f"{self.prefix}{base}#{self.count}"

    def _qparams(self, name: str) -> tuple[str, str, str, dict]:
        """(scale, zero point, Q/DQ domain, attributes) of a tensor's grid: one per channel along
        axis 1 for a per-channel grid (a depthwise convolution's input)."""
        scales, zero_points, domain, axis = qdq_grid(self.tensors[name])
        s, z = self._fresh(f"{name}.scale"), self._fresh(f"{name}.zp")
        self.initializers[s] = numpy_helper.from_array(scales, s)
        self.initializers[z] = numpy_helper.from_array(zero_points, z)
        return s, z, domain, axis

    def value(self, name: str, states: dict[str, str]) -> tuple[str, str]:
        if name not in self.current:
            state = states.get(name, "f")
            dtype = Q_TYPES[self.tensors[name].bits] if state == "q" else self.elem_types.get(name, 1)
            value = self._fresh(name)
            self.inputs.append({"name": name, "value": value, "state": state, "dtype": int(dtype)})
            self.current[name] = (value, state)
        return self.current[name]

    def float_value(self, name: str, states: dict[str, str]) -> str:
        value, state = self.value(name, states)
        if state == "f":
            return value
        s, z, domain, axis = self._qparams(name)
        out = self._fresh(f"{name}.dq")
        self.nodes.append(helper.make_node("DequantizeLinear", [value, s, z], [out], domain=domain, **axis))
        return out

    def quantize(self, name: str, float_value: str) -> None:
        s, z, domain, axis = self._qparams(name)
        out = self._fresh(f"{name}.q")
        self.nodes.append(
            helper.make_node("QuantizeLinear", [float_value, s, z], [out], domain=domain, **axis)
        )
        self.current[name] = (out, "q")

    def add_op(self, op: Op, states: dict[str, str]) -> None:
        kind = op.kind
        if kind == "quantize":
            name = op.inputs[0]
            self.quantize(name, self.float_value(name, states))
            return
        if kind == "float":
            node = onnx.NodeProto()
            node.ParseFromString(self.arrays[op.proto].tobytes())
            originals = [node]
            consts = {i: self.arrays[k] for i, k in op.constants.items()}
            quantize_outputs = False
        else:
            originals = _nodes_between(self.model, op.data_inputs, op.outputs)
            consts = {}
            quantize_outputs = True
        data_inputs = set(op.data_inputs)
        rename: dict[str, str] = {}
        for n in originals:
            for i in n.input:
                if not i or i in rename:
                    continue
                if i in consts:
                    name = self._fresh(i)
                    self.initializers[name] = numpy_helper.from_array(np.asarray(consts[i]), name)
                    rename[i] = name
                elif i in self.model_inits and i not in data_inputs:
                    name = self._fresh(i)
                    init = onnx.TensorProto()
                    init.CopyFrom(self.model_inits[i])
                    init.name = name
                    self.initializers[name] = init
                    rename[i] = name
                elif i in data_inputs or not any(i in m.output for m in originals):
                    rename[i] = self.float_value(i, states)
            for o in n.output:
                if o:
                    rename[o] = self._fresh(f"{o}.f")
        for n in originals:
            copy = onnx.NodeProto()
            copy.CopyFrom(n)
            del copy.input[:]
            copy.input.extend(rename.get(i, i) if i else "" for i in n.input)
            del copy.output[:]
            copy.output.extend(rename.get(o, o) if o else "" for o in n.output)
            self.nodes.append(copy)
        for o in op.outputs:
            if not o:
                continue
            if quantize_outputs and o in self.tensors:
                self.quantize(o, rename[o])
            else:
                self.current[o] = (rename[o], "f")

    def _dtype(self, value: dict) -> int:
        if value["state"] == "q":
            return Q_TYPES[self.tensors[value["name"]].bits]
        return self.elem_types.get(value["name"], TensorProto.FLOAT)

    def build(self, needed: list[str]) -> tuple[bytes, list[dict], list[dict]]:
        outputs = [{"name": n, "value": self.current[n][0], "state": self.current[n][1]} for n in needed]
        graph = helper.make_graph(
            self.nodes,
            "cpu_subgraph",
            [helper.make_tensor_value_info(i["value"], i["dtype"], None) for i in self.inputs],
            [helper.make_tensor_value_info(o["value"], self._dtype(o), None) for o in outputs],
            list(self.initializers.values()),
        )
        opsets = [o for o in self.model.opset_import if o.domain not in ("com.microsoft",)]
        model = helper.make_model(graph, opset_imports=[*opsets, helper.make_opsetid("com.microsoft", 1)])
        model.ir_version = self.model.ir_version
        model.functions.extend(self.model.functions)
        return model.SerializeToString(deterministic=True), self.inputs, outputs
