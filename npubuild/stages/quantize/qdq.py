"""Export the integer model's parameters as a QDQ ONNX model that stock onnxruntime runs.

Every quantized activation gets QuantizeLinear -> DequantizeLinear with the same scale and zero
point; weights become int8 initializers behind DequantizeLinear (per-channel axis), biases int32
at in_scale * w_scale. int16 tensors use the com.microsoft Q/DQ ops (onnxruntime contrib).

Two forms (`quantize = {"qdq_export": ...}`): "standard" computes every op in float between
DequantizeLinear and QuantizeLinear, the pattern other runtimes recognise and fuse into integer
kernels; "exact" (the default) computes lookup tables, adds and MACs with the integer model's own
arithmetic (`qdq_exact.py`), so that onnxruntime gives the integer model's codes.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from npubuild.intmodel.codes import qdq_grid
from npubuild.intmodel.program import IntegerModel, Op
from npubuild.stages.onnx_utils import default_opset, recorded_shapes
from npubuild.stages.quantize.qdq_exact import ExactOps


class _Export:
    def __init__(
        self,
        model: onnx.ModelProto,
        program: IntegerModel,
        arrays: dict[str, np.ndarray],
        exact: bool,
        sep: str = "__",
    ):
        self.model = onnx.ModelProto()
        self.model.CopyFrom(model)
        self.graph = self.model.graph
        self.sep = sep  # between a name and the part a made name is of (export_qdq)
        self.program = program
        self.arrays = arrays
        self.new_inits: list[onnx.TensorProto] = []
        self.uses_ms = False
        opset = default_opset(model) or 13
        shapes = recorded_shapes(model)
        self.exact = ExactOps(program, arrays, self._init, self._named, opset, shapes) if exact else None

    def _named(self, base: str, part: str) -> str:
        """The name of a part (scale, q, DQ, ...) of tensor or op `base`: base, separator, part."""
        return f"{base}{self.sep}{part}"

    def _init(self, name: str, value: np.ndarray) -> str:
        self.new_inits.append(numpy_helper.from_array(value, name))
        return name

    def _qdq_nodes(self, tensor: str, source: str, target: str, t: dict) -> list[onnx.NodeProto]:
        scales, zero_points, domain, axis = qdq_grid(t)  # (per channel: a depthwise input)
        self.uses_ms |= t.bits == 16
        scale = self._init(self._named(tensor, "scale"), scales)
        zp = self._init(self._named(tensor, "zero_point"), zero_points)
        q = self._named(tensor, "q")
        return [
            helper.make_node(
                "QuantizeLinear",
                [source, scale, zp],
                [q],
                name=self._named(tensor, "Q"),
                domain=domain,
                **axis,
            ),
            helper.make_node(
                "DequantizeLinear",
                [q, scale, zp],
                [target],
                name=self._named(tensor, "DQ"),
                domain=domain,
                **axis,
            ),
        ]

    def _dq_const(self, name: str, q: np.ndarray, scale, zero_point, axis: int | None, bits: int) -> str:
        dtype = {8: np.int8, 16: np.int16, 32: np.int32}[bits]
        domain = "com.microsoft" if bits == 16 else ""
        self.uses_ms |= bits == 16
        qn = self._init(self._named(name, "quantized"), q.astype(dtype))
        sn = self._init(self._named(name, "scale"), np.asarray(scale, np.float32))
        zn = self._init(self._named(name, "zp"), np.asarray(zero_point, dtype))
        out = self._named(name, "dequantized")
        attrs = {"axis": axis} if axis is not None else {}
        self.extra_nodes.append(
            helper.make_node(
                "DequantizeLinear", [qn, sn, zn], [out], name=self._named(name, "DQ"), domain=domain, **attrs
            )
        )
        return out

    def run(self) -> onnx.ModelProto:
        tensors = self.program.tensors
        nodes = list(self.graph.node)
        by_output = {o: n for n in nodes for o in n.output}
        by_label = {(n.name or n.output[0]): n for n in nodes}
        self.extra_nodes: list[onnx.NodeProto] = []
        # Q/DQ pairs on every quantized activation.
        outputs = {o.name for o in self.graph.output}
        rename: dict[str, str] = {}
        qdq_after: dict[str, list[onnx.NodeProto]] = {}
        inputs_qdq: list[onnx.NodeProto] = []
        for name, t in tensors.items():
            if name in outputs:
                raw = self._named(name, "float")
                producer = by_output.get(name)
                if producer is not None:
                    for k, o in enumerate(producer.output):
                        if o == name:
                            producer.output[k] = raw
                qdq_after[raw] = self._qdq_nodes(name, raw, name, t)
            else:
                dq = self._named(name, "dq")
                rename[name] = dq
                pair = self._qdq_nodes(name, name, dq, t)
                if name in by_output:
                    qdq_after[name] = pair
                else:
                    inputs_qdq += pair
        # after the renaming of graph outputs' producers, so a MAC that makes an output writes its
        # float result where the output's Q/DQ pair reads it
        replaced: dict[int, list[onnx.NodeProto]] = {}
        for op in self.program.ops:
            node = by_label.get(op.node)
            if node is None:
                continue
            exact = self.exact
            if op.kind in ("conv", "matmul"):
                replaced[id(node)] = (exact and exact.mac(node, op)) or self._mac(node, op)
            elif exact and op.kind == "lut":
                replaced[id(node)] = exact.lut(node, op)
            elif op.kind == "lut" and op.attrs.index_shift:
                replaced[id(node)] = self._bucketed(node, op)
            elif exact and op.kind == "global_avgpool":
                replaced[id(node)] = exact.global_avgpool(node, op) or [node]
            elif exact and op.kind == "layernorm" and (exact_norm := exact.layernorm(node, op)):
                replaced[id(node)] = exact_norm
            elif exact and op.kind == "softmax":
                replaced[id(node)] = exact.softmax(node, op)
            elif exact and op.kind == "batch_matmul" and (exact_product := exact.batch_matmul(node, op)):
                replaced[id(node)] = exact_product
            elif exact and op.kind == "add" and (exact_add := exact.add(node, op)):
                replaced[id(node)] = exact_add
            elif op.kind in ("add", "mul", "concat") and op.constants:
                replaced[id(node)] = self._constant_operands(node, op)
        # codes an exact op writes itself: their QuantizeLinear goes (the DequantizeLinear stays)
        written = {self._named(t, "q") for t in self.exact.written} if self.exact else set()
        new_nodes: list[onnx.NodeProto] = list(self.extra_nodes) + inputs_qdq
        for node in nodes:
            group = replaced.get(id(node), [node])
            for n in group:
                for k, i in enumerate(n.input):
                    if i in rename:
                        n.input[k] = rename[i]
                new_nodes.append(n)
            # after the group: the pairs of what it wrote, and of what the node it replaced wrote
            # (an exact op writes only codes; the DequantizeLinear of its output still belongs here)
            for o in dict.fromkeys([o for n in group for o in n.output] + list(node.output)):
                new_nodes += [q for q in qdq_after.get(o, []) if q.output[0] not in written]
        del self.graph.node[:]
        self.graph.node.extend(_live(new_nodes, {o.name for o in self.graph.output}))
        self.graph.initializer.extend(self.new_inits)
        # the float weights the Q/DQ or exact forms replaced: no node reads them any more
        used = {i for n in self.graph.node for i in n.input} | {o.name for o in self.graph.output}
        kept = [t for t in self.graph.initializer if t.name in used]
        del self.graph.initializer[:]
        self.graph.initializer.extend(kept)
        del self.graph.value_info[:]
        if self.uses_ms or (self.exact and self.exact.uses_ms):
            self.model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
        return self.model

    def _mac(self, node: onnx.NodeProto, op: Op) -> list[onnx.NodeProto]:
        a = op.arrays
        x = op.inputs[0]
        wq, wscale, bias = self.arrays[a.weight], self.arrays[a.weight_scale], self.arrays[a.bias]
        xscale = np.reshape(self.program.tensors[x].channel_scales(2), -1)  # (per channel: depthwise)
        label = node.name or node.output[0]
        if node.op_type == "ConvTranspose":
            waxis = 1
        elif node.op_type in ("MatMul", "Gemm"):
            waxis = 1
        else:
            waxis = 0
        weight = wq
        if node.op_type == "Gemm" and any(at.name == "transB" and at.i for at in node.attribute):
            weight, waxis = wq.T, 0
        if node.op_type == "ConvTranspose" and op.attrs.group != 1:
            raise NotImplementedError("grouped ConvTranspose export")
        w_dq = self._dq_const(
            f"{label}.weight", weight, wscale.astype(np.float32), np.zeros(len(wscale)), waxis, 8
        )
        bias_scale = (xscale * wscale).astype(np.float32)
        if self.program.tensors[x].bits == 8:
            b_dq = self._dq_const(
                f"{label}.bias", bias.astype(np.int32), bias_scale, np.zeros(len(bias)), 0, 32
            )
        else:  # an int64 bias has no DequantizeLinear: store its exact value in float
            b_dq = self._init(
                self._named(f"{label}.bias", "float"),
                (bias * (xscale * wscale.astype(np.float64))).astype(np.float32),
            )
        inputs = list(node.input)
        inputs[1] = w_dq
        if node.op_type in ("Conv", "ConvTranspose", "Gemm"):
            inputs = inputs[:2] + [b_dq]
            del node.input[:]
            node.input.extend(inputs)
            return [node]
        # MatMul has no bias input: add the (corrected) bias after it.
        del node.input[:]
        node.input.extend(inputs)
        out = node.output[0]
        node.output[0] = self._named(out, "matmul")
        return [node, helper.make_node("Add", [node.output[0], b_dq], [out], name=self._named(label, "bias"))]

    def _bucketed(self, node: onnx.NodeProto, op: Op) -> list[onnx.NodeProto]:
        """A table that reads its input's top bits (a fine pre-activation), in standard ops: the
        dequantized input moved to the middle of its run of 2^shift codes, then the activation.
        u = (x - qmin - m) s with m = (2^shift - 1) / 2 is never within 0.03 steps of a rounding
        tie (the fractions are (j - m) / 2^shift), so QuantizeLinear at 2^shift s gives the run's
        index in float32 as the integer model's shift does; adding (qmin + m - zp) s back gives
        the value the table was made at."""
        x, t = op.inputs[0], self.program.tensors[op.inputs[0]]
        label = node.name or node.output[0]
        run = 1 << op.attrs.index_shift
        middle = (run - 1) / 2
        qmin = -(2 ** (t.bits - 1))
        to_run = self._init(
            self._named(label, "to_run"), np.array((t.zero_point - qmin - middle) * t.scale, np.float32)
        )
        back = self._init(
            self._named(label, "from_run"), np.array((qmin + middle - t.zero_point) * t.scale, np.float32)
        )
        scale = self._init(self._named(label, "run_scale"), np.array(run * t.scale, np.float32))
        zero = self._init(self._named(label, "run_zp"), np.array(0, np.int16))
        self.uses_ms = True
        nodes = [
            helper.make_node("Add", [x, to_run], [self._named(label, "shifted")]),
            helper.make_node(
                "QuantizeLinear",
                [self._named(label, "shifted"), scale, zero],
                [self._named(label, "run")],
                domain="com.microsoft",
            ),
            helper.make_node(
                "DequantizeLinear",
                [self._named(label, "run"), scale, zero],
                [self._named(label, "run_dq")],
                domain="com.microsoft",
            ),
            helper.make_node("Add", [self._named(label, "run_dq"), back], [self._named(label, "middle")]),
        ]
        node.input[0] = self._named(label, "middle")
        return [*nodes, node]

    def _constant_operands(self, node: onnx.NodeProto, op: Op) -> list[onnx.NodeProto]:
        params = op.operand_params
        inputs = list(node.input)
        if op.kind == "mul" and node.op_type == "Div":
            node.op_type = "Mul"
            inputs[1] = self._named(inputs[1], "reciprocal")
        for k, name in enumerate(op.inputs):
            key = op.constants.get(name)
            if key is None:
                continue
            p = params[k]
            inputs[k] = self._dq_const(
                f"{node.name or node.output[0]}.{k}",
                self.arrays[key],
                p.scale,
                p.zero_point,
                None,
                p.bits,
            )
        del node.input[:]
        node.input.extend(inputs)
        return [node]


def _live(nodes: list[onnx.NodeProto], outputs: set[str]) -> list[onnx.NodeProto]:
    """The nodes some graph output depends on, in their order: the exact form leaves the
    DequantizeLinear of a tensor that only exact ops read (they read its codes) without readers."""
    needed, live = set(outputs), []
    for node in reversed(nodes):
        if any(o in needed for o in node.output):
            live.append(node)
            needed.update(node.input)
    return live[::-1]


SEPARATOR_KEY = "npubuild.name_separator"


def _names_clash(model: onnx.ModelProto) -> bool:
    """Whether two initializers, two node outputs, or an initializer and a node output share a
    name (what the ONNX checker refuses)."""
    made = [t.name for t in model.graph.initializer] + [o for n in model.graph.node for o in n.output if o]
    return len(made) != len(set(made))


def export_qdq(
    model: onnx.ModelProto, program: IntegerModel, arrays: dict[str, np.ndarray], form: str = "exact"
) -> onnx.ModelProto:
    # The export's names are a tensor's or op's name, a separator and a part (x__scale, x__q). A
    # model that already has such names (a pre-quantized one, an export of ours) would clash:
    # then the separator grows ("___", ...) until nothing does; every other model keeps "__".
    sep = "__"
    exported = _Export(model, program, arrays, exact=form == "exact", sep=sep).run()
    while _names_clash(exported) and len(sep) < 8:
        sep += "_"
        exported = _Export(model, program, arrays, exact=form == "exact", sep=sep).run()
    if sep != "__":  # evaluate finds each tensor's codes by name: NAME + separator + "q"
        helper.set_model_props(exported, {SEPARATOR_KEY: sep})
    onnx.checker.check_model(exported)
    return exported


def codes_name(qdq: onnx.ModelProto, tensor: str) -> str:
    """The name of `tensor`'s integer codes (its QuantizeLinear output) in an export of ours."""
    props = {p.key: p.value for p in qdq.metadata_props}
    return f"{tensor}{props.get(SEPARATOR_KEY, '__')}q"


__all__ = ["export_qdq", "codes_name", "TensorProto"]
