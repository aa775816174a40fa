"""From the optimized float model and calibration statistics to the integer model (a program).

The program is plain JSON (ops in order, tensor parameters) plus named integer arrays; see
docs/quantization.md for the semantics of every op kind.
"""

from __future__ import annotations

import fnmatch
import math
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper, numpy_helper

from npubuild.intmodel.codes import qrange
from npubuild.intmodel.fixedpoint import add_multiplier, quantize_multiplier
from npubuild.intmodel.lut import lut_function
from npubuild.intmodel.ops import LUT_OPS, MAC_OPS, MOVE_OPS
from npubuild.stages.quantize import ranges
from npubuild.stages.reductions import vector_matrix
from npubuild.targets.support import integer_blocker


@dataclass
class TensorParams:
    scale: float
    zero_point: int
    bits: int

    def as_dict(self) -> dict:
        return {"scale": self.scale, "zero_point": self.zero_point, "bits": self.bits}


@dataclass
class NodeChoice:
    integer: bool
    bits: int
    method: str
    reason: str = ""


@dataclass
class Program:
    ops: list[dict] = field(default_factory=list)
    tensors: dict[str, dict] = field(default_factory=dict)
    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    float_nodes: list[dict] = field(default_factory=list)
    integer_nodes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def add_array(self, key: str, value: np.ndarray) -> str:
        self.arrays[key] = value
        return key


def _attr(node: onnx.NodeProto, name: str, default=None):
    for a in node.attribute:
        if a.name == name:
            value = helper.get_attribute_value(a)
            return value.decode() if isinstance(value, bytes) else value
    return default


def node_label(node: onnx.NodeProto) -> str:
    return node.name or node.output[0]


class Builder:
    def __init__(
        self,
        model: onnx.ModelProto,
        stats_meta: dict,
        stats_arrays: dict,
        config: dict,
        dry: bool = False,
        range_cache: dict | None = None,
    ):
        # dry: decide every tensor's parameters and which nodes are integer, but build no arrays
        # (weights, tables): what the precision search needs, many times over, cheaply.
        self.dry = dry
        self.range_cache = range_cache if range_cache is not None else {}
        self.model = model
        self.graph = model.graph
        self.config = config
        self.stats_meta = stats_meta
        self.stats_arrays = stats_arrays
        info = self.range_cache.get("__graph__")
        if info is None:  # what does not depend on the settings, shared by dry runs over one model
            constants = {t.name: numpy_helper.to_array(t) for t in self.graph.initializer}
            shapes = {}
            for v in [*self.graph.input, *self.graph.value_info, *self.graph.output]:
                shapes[v.name] = [d.dim_value for d in v.type.tensor_type.shape.dim]
            consumers: dict[str, list[onnx.NodeProto]] = {}
            for n in self.graph.node:
                for i in n.input:
                    consumers.setdefault(i, []).append(n)
            info = (constants, shapes, consumers, {o.name for o in self.graph.output})
            self.range_cache["__graph__"] = info
        constants, self.shapes, self.consumers, self.outputs = info
        # handlers add derived constants (a Div's reciprocal): keep the shared dict untouched
        self.constants = dict(constants)
        self.program = Program()
        self.params: dict[str, TensorParams] = {}
        self.matched_overrides: set[int] = set()

    # choices ----------------------------------------------------------------------------------
    def choose(self, node: onnx.NodeProto) -> NodeChoice:
        cfg = self.config
        choice = NodeChoice(True, cfg["activation_bits"], cfg["method"])
        for i, override in enumerate(self.config.get("overrides", [])):
            by_name = override.get("match") and fnmatch.fnmatchcase(node_label(node), override["match"])
            by_type = override.get("op_type") and override["op_type"] == node.op_type
            if not (by_name or by_type):
                continue
            self.matched_overrides.add(i)
            if override.get("keep_float"):
                return NodeChoice(False, 0, "", f"override #{i + 1} keeps it float")
            if override.get("bits"):
                choice.bits = override["bits"]
            if override.get("method"):
                choice.method = override["method"]
        if (
            cfg.get("float_output_activations")
            and node.op_type in LUT_OPS
            and any(o in self.outputs for o in node.output)
        ):
            return NodeChoice(
                False, 0, "", "a network output's activation stays float (float_output_activations)"
            )
        reason = self.integer_blocker(node)
        if reason:
            return NodeChoice(False, 0, "", reason)
        return choice

    def integer_blocker(self, node: onnx.NodeProto) -> str:
        return integer_blocker(node, lambda name, default: _attr(node, name, default), self.constants)

    # tensor parameters ------------------------------------------------------------------------
    def from_stats(self, name: str, bits: int, method: str) -> TensorParams:
        key = (name, bits, method)
        if key not in self.range_cache:
            self.range_cache[key] = self._from_stats(name, bits, method)
        params, warnings = self.range_cache[key]
        self.program.warnings.extend(w for w in warnings if w not in self.program.warnings)
        return params

    def _from_stats(self, name: str, bits: int, method: str) -> tuple[TensorParams, list[str]]:
        warnings = []
        meta = self.stats_meta.get(name)
        if meta is None or meta["count"] == 0:
            warnings.append(f"no calibration statistics for '{name}'; using range [-1, 1]")
            lo, hi = -1.0, 1.0
        else:
            hist = self.stats_arrays[f"{name}/hist"]
            lo, hi = ranges.METHOD_FUNCTIONS[method](
                meta, hist, bits, self.config["symmetric_activations"], self.config["percentile"]
            )
            if meta.get("nonfinite"):
                warnings.append(
                    f"'{name}' had {meta['nonfinite']} NaN/Inf values in calibration; "
                    "they were left out of its range"
                )
        scale, zp = ranges.quant_params(float(lo), float(hi), bits, self.config["symmetric_activations"])
        return TensorParams(scale, zp, bits), warnings

    def set_params(self, name: str, params: TensorParams) -> None:
        self.params[name] = params
        self.program.tensors[name] = params.as_dict()

    def constant_params(self, value: np.ndarray, bits: int) -> tuple[TensorParams, np.ndarray]:
        lo, hi = float(value.min()), float(value.max())
        scale, zp = ranges.quant_params(lo, hi, bits, symmetric=False)
        qmin, qmax = qrange(bits)
        q = np.clip(np.rint(value / scale) + zp, qmin, qmax).astype(np.int32)
        return TensorParams(scale, zp, bits), q

    # the build --------------------------------------------------------------------------------
    def build(self) -> Program:
        prog = self.program
        choices = {id(n): self.choose(n) for n in self.graph.node}
        fused: dict[int, onnx.NodeProto] = {}  # id(conv) -> activation node folded into it
        for n in self.graph.node:
            if n.op_type in MAC_OPS and choices[id(n)].integer:
                users = self.consumers.get(n.output[0], [])
                if (
                    len(users) == 1
                    and users[0].op_type in ("Relu", "Clip")
                    and choices[id(users[0])].integer
                    and n.output[0] not in self.outputs
                ):
                    fused[id(n)] = users[0]
        skip = {id(a) for a in fused.values()}
        initializers = set(self.constants)
        for value in self.graph.input:
            if value.name in initializers:
                continue
            users = self.consumers.get(value.name, [])
            if any(choices[id(u)].integer for u in users):
                bits = max(choices[id(u)].bits for u in users if choices[id(u)].integer)
                self.set_params(value.name, self.from_stats(value.name, bits, self.config["method"]))
                prog.ops.append({"kind": "quantize", "inputs": [value.name], "outputs": [value.name]})
        for node in self.graph.node:
            if id(node) in skip:
                continue
            choice = choices[id(node)]
            if not choice.integer:
                self.float_op(node, choice.reason, choices)
                continue
            self.integer_op(node, choice, fused.get(id(node)))
        for i, override in enumerate(self.config.get("overrides", [])):
            if i not in self.matched_overrides:
                what = override.get("match") or override.get("op_type")
                prog.warnings.append(f"override #{i + 1} ('{what}') matches no node")
        return prog

    def ensure_quantized(self, name: str, bits: int, method: str) -> None:
        """An integer op reads `name`: give it parameters if a float op or the model made it."""
        if name in self.params:
            return
        self.set_params(name, self.from_stats(name, bits, method))
        self.program.ops.append({"kind": "quantize", "inputs": [name], "outputs": [name]})

    def float_op(self, node: onnx.NodeProto, reason: str, choices: dict) -> None:
        prog = self.program
        if self.dry:
            prog.float_nodes.append({"node": node_label(node), "op_type": node.op_type, "reason": reason})
            for out in node.output:
                integer_users = [u for u in self.consumers.get(out, []) if choices[id(u)].integer]
                if integer_users:
                    self.ensure_quantized(
                        out, max(choices[id(u)].bits for u in integer_users), self.config["method"]
                    )
            return
        key = f"node/{len(prog.ops)}"
        prog.add_array(key, np.frombuffer(node.SerializeToString(deterministic=True), dtype=np.uint8))
        const_keys = {}
        for i in node.input:
            if i in self.constants:
                const_keys[i] = prog.add_array(f"const/{i}", self.constants[i])
        prog.ops.append(
            {
                "kind": "float",
                "op_type": node.op_type,
                "node": node_label(node),
                "proto": key,
                "inputs": list(node.input),
                "outputs": list(node.output),
                "constants": const_keys,
            }
        )
        prog.float_nodes.append({"node": node_label(node), "op_type": node.op_type, "reason": reason})
        for out in node.output:
            users = self.consumers.get(out, [])
            integer_users = [u for u in users if choices[id(u)].integer]
            if integer_users:
                bits = max(choices[id(u)].bits for u in integer_users)
                self.ensure_quantized(out, bits, self.config["method"])

    def integer_op(self, node: onnx.NodeProto, choice: NodeChoice, activation: onnx.NodeProto | None) -> None:
        op = node.op_type
        self.program.integer_nodes.append(node_label(node))
        data_inputs = [i for i in node.input if i and i not in self.constants]
        for i in data_inputs:
            self.ensure_quantized(i, choice.bits, choice.method)
        out = (activation or node).output[0]
        if op in MOVE_OPS:
            for o in node.output:
                if o:
                    self.set_params(o, self.params[node.input[0]])
            if not self.dry:
                self.move_op(node)
            return
        if op in ("Relu", "Clip"):
            self.set_params(out, self.params[node.input[0]])
            lo, hi = self.clamp_bounds(node, self.params[out])
            self.program.ops.append(
                {
                    "kind": "clamp",
                    "node": node_label(node),
                    "inputs": [node.input[0]],
                    "outputs": [out],
                    "attrs": {"min": lo, "max": hi},
                }
            )
            return
        out_params = self.from_stats(out, choice.bits, choice.method)
        if op == "Resize":
            out_params = self.params[node.input[0]]
        self.set_params(out, out_params)
        if self.dry:
            return
        handler = {
            "Conv": self.conv,
            "ConvTranspose": self.conv,
            "MatMul": self.matmul,
            "Gemm": self.matmul,
            "Add": self.add,
            "Sub": self.add,
            "Mul": self.mul,
            "Div": self.mul,
            "Concat": self.concat,
            "GlobalAveragePool": self.global_avgpool,
            "AveragePool": self.avgpool,
            "Resize": self.resize,
        }.get(op)
        if op in LUT_OPS:
            self.lut(node)
        else:
            handler(node, activation)

    # op encoders ------------------------------------------------------------------------------
    def clamp_bounds(self, act: onnx.NodeProto | None, params: TensorParams) -> tuple[int, int]:
        qmin, qmax = qrange(params.bits)
        if act is None:
            return qmin, qmax
        if act.op_type == "Relu":
            lo_f, hi_f = 0.0, math.inf
        else:
            lo_f = float(self.constants[act.input[1]]) if len(act.input) > 1 and act.input[1] else -math.inf
            hi_f = float(self.constants[act.input[2]]) if len(act.input) > 2 and act.input[2] else math.inf
            lo_f = _attr(act, "min", lo_f) if self.opset_below_11() else lo_f
            hi_f = _attr(act, "max", hi_f) if self.opset_below_11() else hi_f
        lo = qmin if lo_f == -math.inf else max(qmin, int(np.rint(lo_f / params.scale)) + params.zero_point)
        hi = qmax if hi_f == math.inf else min(qmax, int(np.rint(hi_f / params.scale)) + params.zero_point)
        return int(lo), int(hi)

    def opset_below_11(self) -> bool:
        return any(o.domain in ("", "ai.onnx") and o.version < 11 for o in self.model.opset_import)

    def quantize_weight(
        self, node: onnx.NodeProto, weight: np.ndarray, axis: int
    ) -> tuple[np.ndarray, np.ndarray]:
        w = weight.astype(np.float64)
        if self.config["per_channel"]:
            reduce = tuple(i for i in range(w.ndim) if i != axis)
            absmax = np.max(np.abs(w), axis=reduce)
        else:
            absmax = np.full(w.shape[axis], np.max(np.abs(w)))
        scale = np.where(absmax > 0, absmax / 127.0, 1.0)
        shape = [1] * w.ndim
        shape[axis] = -1
        q = np.clip(np.rint(w / scale.reshape(shape)), -127, 127).astype(np.int8)
        return q, scale

    def conv(self, node: onnx.NodeProto, activation: onnx.NodeProto | None) -> None:
        transpose = node.op_type == "ConvTranspose"
        x, out = node.input[0], (activation or node).output[0]
        w = self.constants[node.input[1]]
        group = int(_attr(node, "group", 1))
        if transpose:
            cout_g = w.shape[1]
            cout = cout_g * group
            # per output channel: for group 1 it is axis 1
            wq, wscale = (
                self.quantize_weight(node, w, 1) if group == 1 else self._grouped_transpose_scales(w, group)
            )
        else:
            cout = w.shape[0]
            wq, wscale = self.quantize_weight(node, w, 0)
        bias = (
            self.constants[node.input[2]].astype(np.float64)
            if len(node.input) > 2 and node.input[2]
            else np.zeros(cout)
        )
        xp, yp = self.params[x], self.params[out]
        bias = self.bias_correction(x, w, wq, wscale, bias, group, transpose)
        spatial = w.ndim - 2
        attrs = {
            "strides": list(_attr(node, "strides", [1] * spatial)),
            "pads": list(_attr(node, "pads", [0] * 2 * spatial)),
            "dilations": list(_attr(node, "dilations", [1] * spatial)),
            "group": group,
            "transpose": transpose,
            "output_padding": list(_attr(node, "output_padding", [0] * spatial)),
            "auto_pad": _attr(node, "auto_pad", "NOTSET"),
        }
        self.mac_op("conv", node, x, out, wq, wscale, bias, xp, yp, activation, attrs)

    def _grouped_transpose_scales(self, w: np.ndarray, group: int):
        cin, cout_g = w.shape[0], w.shape[1]
        per = w.reshape(group, cin // group, cout_g, *w.shape[2:])
        absmax = np.max(np.abs(per), axis=tuple(i for i in range(per.ndim) if i not in (0, 2))).reshape(-1)
        scale = np.where(absmax > 0, absmax / 127.0, 1.0)
        q = np.clip(np.rint(per / scale.reshape(group, 1, cout_g, *([1] * (w.ndim - 2)))), -127, 127)
        return q.reshape(w.shape).astype(np.int8), scale

    def bias_correction(self, x, w, wq, wscale, bias, group, transpose):
        mean = self.stats_arrays.get(f"{x}/channel_mean")
        if not self.config["bias_correction"] or mean is None:
            return bias
        if transpose:
            if group != 1:
                return bias
            shape = [1] * w.ndim
            shape[1] = -1
            delta = wq.astype(np.float64) * wscale.reshape(shape) - w  # [Cin, Cout, k...]
            per_pair = delta.reshape(delta.shape[0], delta.shape[1], -1).sum(axis=2)
            return bias - vector_matrix(mean, per_pair)
        shape = [-1] + [1] * (w.ndim - 1)
        delta = wq.astype(np.float64) * wscale.reshape(shape) - w  # [Cout, Cin/g, k...]
        cout, cin_g = w.shape[0], w.shape[1]
        per_out_group = cout // group
        means = mean.astype(np.float64).reshape(group, cin_g)
        correction = np.empty(cout)
        for o in range(cout):
            correction[o] = np.sum(delta[o].reshape(cin_g, -1).sum(axis=1) * means[o // per_out_group])
        return bias - correction

    def mac_op(self, kind, node, x, out, wq, wscale, bias, xp, yp, activation, attrs) -> None:
        prog = self.program
        acc_scale = xp.scale * wscale
        # int8 inputs: an int32 bias; int16 inputs: int64 (TFLite's 16x8 scheme), whose scale
        # in_scale * w_scale is ~256x finer and would overflow int32 for ordinary biases.
        limit = 2**31 - 1 if xp.bits == 8 else 2**47
        bias_q = np.clip(np.rint(bias / acc_scale), -limit - 1, limit).astype(np.int64)
        mbits = 31 if xp.bits == 8 else 15
        m0, shift = zip(*(quantize_multiplier(float(s / yp.scale)) for s in acc_scale))
        m0 = np.array(m0, np.int64)
        shift = np.array(shift, np.int64)
        if mbits == 15:
            m0, shift = np.right_shift(m0, 16), shift - 16
        lo, hi = self.clamp_bounds(activation, yp)
        base = f"{kind}/{len(prog.ops)}"
        prog.ops.append(
            {
                "kind": kind,
                "op_type": node.op_type,
                "node": node_label(node),
                "inputs": [x],
                "outputs": [out],
                "attrs": {**attrs, "min": lo, "max": hi, "mbits": mbits},
                "arrays": {
                    "weight": prog.add_array(f"{base}/weight", wq),
                    "bias": prog.add_array(f"{base}/bias", bias_q),
                    "m0": prog.add_array(f"{base}/m0", m0),
                    "shift": prog.add_array(f"{base}/shift", shift),
                    "weight_scale": prog.add_array(f"{base}/weight_scale", wscale.astype(np.float64)),
                },
                "activation": activation.op_type if activation is not None else None,
            }
        )

    def matmul(self, node: onnx.NodeProto, activation: onnx.NodeProto | None) -> None:
        x, out = node.input[0], (activation or node).output[0]
        w = self.constants[node.input[1]]
        if node.op_type == "Gemm" and _attr(node, "transB", 0):
            w = w.T
        wq, wscale = self.quantize_weight(node, w, 1)
        n = w.shape[1]
        bias = np.zeros(n)
        if node.op_type == "Gemm" and len(node.input) > 2 and node.input[2]:
            bias = np.broadcast_to(self.constants[node.input[2]].astype(np.float64), (n,)).copy()
        mean = self.stats_arrays.get(f"{x}/channel_mean")
        if self.config["bias_correction"] and mean is not None and mean.shape == (w.shape[0],):
            delta = wq.astype(np.float64) * wscale.reshape(1, -1) - w
            bias = bias - vector_matrix(mean, delta)
        self.mac_op(
            "matmul", node, x, out, wq, wscale, bias, self.params[x], self.params[out], activation, {}
        )

    def operand(self, name: str, bits: int) -> tuple[str, TensorParams, str | None]:
        """A data tensor, or a constant quantized to its own grid (returned as an array key)."""
        if name in self.constants:
            params, q = self.constant_params(self.constants[name].astype(np.float64), bits)
            key = self.program.add_array(f"const/{len(self.program.ops)}/{name}", q)
            return name, params, key
        return name, self.params[name], None

    def add(self, node: onnx.NodeProto, activation=None) -> None:
        out = node.output[0]
        yp = self.params[out]
        bits = yp.bits
        (a, ap, akey), (b, bp, bkey) = self.operand(node.input[0], bits), self.operand(node.input[1], bits)
        sign = -1 if node.op_type == "Sub" else 1
        self.program.ops.append(
            {
                "kind": "add",
                "op_type": node.op_type,
                "node": node_label(node),
                "inputs": [a, b],
                "outputs": [out],
                "attrs": {
                    "ma": add_multiplier(ap.scale / yp.scale),
                    "mb": sign * add_multiplier(bp.scale / yp.scale),
                    "za": ap.zero_point,
                    "zb": bp.zero_point,
                },
                "constants": {k: v for k, v in ((a, akey), (b, bkey)) if v},
                "operand_params": [ap.as_dict(), bp.as_dict()],
            }
        )

    def mul(self, node: onnx.NodeProto, activation=None) -> None:
        out = node.output[0]
        yp = self.params[out]
        a_name, b_name = node.input[0], node.input[1]
        if node.op_type == "Div":  # x / c == x * (1/c)
            reciprocal = 1.0 / self.constants[b_name].astype(np.float64)
            b_name = f"{b_name}__reciprocal"
            self.constants[b_name] = reciprocal
        (a, ap, akey), (b, bp, bkey) = self.operand(a_name, yp.bits), self.operand(b_name, yp.bits)
        mbits = 31 if ap.bits == 8 and bp.bits == 8 else 15
        m0, shift = quantize_multiplier(ap.scale * bp.scale / yp.scale)
        if mbits == 15:
            m0, shift = m0 >> 16, shift - 16
        self.program.ops.append(
            {
                "kind": "mul",
                "op_type": node.op_type,
                "node": node_label(node),
                "inputs": [a, b],
                "outputs": [out],
                "attrs": {"m0": m0, "shift": shift, "za": ap.zero_point, "zb": bp.zero_point, "mbits": mbits},
                "constants": {k: v for k, v in ((a, akey), (b, bkey)) if v},
                "operand_params": [ap.as_dict(), bp.as_dict()],
            }
        )

    def rescale_attrs(self, src: TensorParams, dst: TensorParams) -> dict:
        m0, shift = quantize_multiplier(src.scale / dst.scale)
        if src.bits == 16:
            m0, shift = m0 >> 16, shift - 16
        return {"m0": m0, "shift": shift, "zin": src.zero_point, "same": src == dst}

    def concat(self, node: onnx.NodeProto, activation=None) -> None:
        out = node.output[0]
        yp = self.params[out]
        operands = [self.operand(i, yp.bits) for i in node.input]
        self.program.ops.append(
            {
                "kind": "concat",
                "node": node_label(node),
                "inputs": [o[0] for o in operands],
                "outputs": [out],
                "attrs": {
                    "axis": int(_attr(node, "axis")),
                    "rescale": [self.rescale_attrs(p, yp) for _, p, _ in operands],
                },
                "constants": {name: key for name, _, key in operands if key},
                "operand_params": [p.as_dict() for _, p, _ in operands],
            }
        )

    def avgpool(self, node: onnx.NodeProto, activation=None) -> None:
        """Window sums of zero-point-free codes, divided by each window's element count (which is
        smaller at the borders unless count_include_pad) through a per-position multiplier."""
        from npubuild.intmodel.kernels import pool_counts

        x, out = node.input[0], node.output[0]
        xp, yp = self.params[x], self.params[out]
        attrs = {
            "kernel_shape": list(_attr(node, "kernel_shape")),
            "strides": list(_attr(node, "strides", [1] * len(_attr(node, "kernel_shape")))),
            "pads": list(_attr(node, "pads", [0] * 2 * len(_attr(node, "kernel_shape")))),
            "ceil_mode": int(_attr(node, "ceil_mode", 0)),
            "count_include_pad": int(_attr(node, "count_include_pad", 0)),
        }
        counts = pool_counts(self.shapes[x][2:], attrs)
        pairs = [quantize_multiplier(xp.scale / (yp.scale * c)) for c in counts.reshape(-1)]
        m0 = np.array([p[0] for p in pairs], np.int64).reshape(counts.shape)
        shift = np.array([p[1] for p in pairs], np.int64).reshape(counts.shape)
        if xp.bits == 16:
            m0, shift = np.right_shift(m0, 16), shift - 16
        base = f"avgpool/{len(self.program.ops)}"
        self.program.ops.append(
            {
                "kind": "avgpool",
                "node": node_label(node),
                "inputs": [x],
                "outputs": [out],
                "attrs": attrs,
                "arrays": {
                    "m0": self.program.add_array(f"{base}/m0", m0),
                    "shift": self.program.add_array(f"{base}/shift", shift),
                },
            }
        )

    def global_avgpool(self, node: onnx.NodeProto, activation=None) -> None:
        x, out = node.input[0], node.output[0]
        xp, yp = self.params[x], self.params[out]
        count = int(np.prod(self.shapes[x][2:]))
        m0, shift = quantize_multiplier(xp.scale / (yp.scale * count))
        mbits = 31 if xp.bits == 8 else 15
        if mbits == 15:
            m0, shift = m0 >> 16, shift - 16
        self.program.ops.append(
            {
                "kind": "global_avgpool",
                "node": node_label(node),
                "inputs": [x],
                "outputs": [out],
                "attrs": {"m0": m0, "shift": shift, "mbits": mbits},
            }
        )

    def resize(self, node: onnx.NodeProto, activation=None) -> None:
        x, out = node.input[0], node.output[0]
        self.program.ops.append(
            {
                "kind": "resize_nearest",
                "node": node_label(node),
                "inputs": [x],
                "outputs": [out],
                "attrs": {
                    "out_shape": self.shapes[out],
                    "coordinate_transformation_mode": _attr(
                        node, "coordinate_transformation_mode", "half_pixel"
                    ),
                    "nearest_mode": _attr(node, "nearest_mode", "round_prefer_floor"),
                },
            }
        )

    def lut(self, node: onnx.NodeProto) -> None:
        x, out = node.input[0], node.output[0]
        xp, yp = self.params[x], self.params[out]
        qmin, qmax = qrange(xp.bits)
        codes = np.arange(qmin, qmax + 1, dtype=np.float64)
        real = ((codes - xp.zero_point) * xp.scale).astype(np.float32)
        fn = lut_function(node.op_type, {a.name: helper.get_attribute_value(a) for a in node.attribute})
        y = fn(real).astype(np.float32)
        oqmin, oqmax = qrange(yp.bits)
        table = np.clip(np.rint(y.astype(np.float64) / yp.scale) + yp.zero_point, oqmin, oqmax).astype(
            np.int32
        )
        key = self.program.add_array(f"lut/{len(self.program.ops)}", table)
        self.program.ops.append(
            {
                "kind": "lut",
                "op_type": node.op_type,
                "node": node_label(node),
                "inputs": [x],
                "outputs": [out],
                "attrs": {"offset": -qmin},
                "arrays": {"table": key},
            }
        )

    def move_op(self, node: onnx.NodeProto) -> None:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        attrs = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in attrs.items()}
        consts = {}
        for i in node.input[1:]:
            if i:
                consts[i] = self.program.add_array(f"const/{i}", self.constants[i])
        self.program.ops.append(
            {
                "kind": "move",
                "op_type": node.op_type,
                "node": node_label(node),
                "inputs": list(node.input),
                "outputs": [o for o in node.output],
                "attrs": {k: (list(v) if isinstance(v, (list, tuple)) else v) for k, v in attrs.items()},
                "constants": consts,
            }
        )
