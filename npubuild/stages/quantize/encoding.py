"""Encoding the integer model: a `QuantPlan` (planning.py) -> the program's ops and named integer
arrays (weights, biases, multipliers, lookup tables). The program is plain JSON (ops in order,
tensor parameters) plus the arrays; docs/quantization.md gives the semantics of every op kind.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import onnx

from npubuild.intmodel.codes import qrange
from npubuild.intmodel.fixedpoint import add_multiplier, quantize_multiplier
from npubuild.intmodel.ops import LUT_OPS, MOVE_OPS, TABULATED_OPS
from npubuild.stages.onnx_utils import node_attributes
from npubuild.stages.quantize import tables
from npubuild.stages.quantize.gptq import rounded_codes
from npubuild.stages.quantize.planning import Planner, QuantPlan, TensorParams, attr, node_label
from npubuild.stages.quantize.weights import (
    bias_correction,
    bias_limit,
    constant_params,
    grouped_transpose_scales,
    quantize_weight,
)


@dataclass
class Program:
    ops: list[dict] = field(default_factory=list)
    tensors: dict[str, dict] = field(default_factory=dict)
    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    float_nodes: list[dict] = field(default_factory=list)
    integer_nodes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    pixel_inputs: list[str] = field(default_factory=list)
    # 16-bit MAC results only an activation reads (planning.py); the search prices them
    fine_preactivations: set[str] = field(default_factory=set)

    def add_array(self, key: str, value: np.ndarray) -> str:
        self.arrays[key] = value
        return key


def build_program(
    model: onnx.ModelProto, stats_meta: dict, stats_arrays: dict, config: dict, range_cache=None
) -> Program:
    """Plan, then encode: the integer model of `model` under `config`."""
    planner = Planner(model, stats_meta, stats_arrays, config, range_cache)
    return Encoder(
        model, planner.build(), planner.info.constants, planner.info.shapes, stats_arrays, config
    ).encode()


def product_attrs(ap: TensorParams, bp: TensorParams, yp: TensorParams) -> dict:
    """The requantization of a product of two codes (a Mul, a MatMul of two activations): one
    multiplier s_a s_b / s_y."""
    m0, shift = quantize_multiplier(ap.scale * bp.scale / yp.scale)
    return {"m0": m0, "shift": shift, "za": ap.zero_point, "zb": bp.zero_point}


class Encoder:
    def __init__(
        self,
        model: onnx.ModelProto,
        plan: QuantPlan,
        constants: dict,
        shapes: dict,
        stats_arrays: dict,
        config: dict,
    ):
        self.model, self.plan, self.config = model, plan, config
        # handlers add derived constants (a Div's reciprocal): keep the shared dict untouched
        self.constants = dict(constants)
        self.shapes = shapes
        self.stats_arrays = stats_arrays
        self.params: dict[str, TensorParams] = plan.params
        self.fine_preactivations = plan.fine_preactivations
        self.program = Program(
            tensors=plan.tensors,
            float_nodes=plan.float_nodes,
            integer_nodes=plan.integer_nodes,
            warnings=plan.warnings,
            pixel_inputs=plan.pixel_inputs,
            fine_preactivations=plan.fine_preactivations,
        )

    def encode(self) -> Program:
        for step in self.plan.steps:
            if step.kind == "quantize":
                self.program.ops.append({"kind": "quantize", "inputs": [step.name], "outputs": [step.name]})
            elif step.kind == "float":
                self.float_op(step.node)
            else:
                self.integer_op(step.node, step.activation)
        return self.program

    def weight_codes(self, node: onnx.NodeProto, w: np.ndarray, axis: int) -> tuple[np.ndarray, np.ndarray]:
        """A MAC layer's int8 weight codes and per-output-channel scales: nearest rounding, or
        GPTQ's (gptq.py) where quantize worked out the layer's input correlations."""
        wq, wscale = quantize_weight(w, axis, self.config["per_channel"])
        gram = self.stats_arrays.get(f"{node_label(node)}/gram")
        if gram is None:
            return wq, wscale
        return rounded_codes(node.op_type, w, wscale, gram), wscale

    def channel_mean(self, name: str):
        """The input's per-channel calibration mean when bias correction is on."""
        return self.stats_arrays.get(f"{name}/channel_mean") if self.config["bias_correction"] else None

    def float_op(self, node: onnx.NodeProto) -> None:
        prog = self.program
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

    def integer_op(self, node: onnx.NodeProto, activation: onnx.NodeProto | None) -> None:
        op = node.op_type
        out = (activation or node).output[0]
        if op in MOVE_OPS:
            self.move_op(node)
            return
        if op in ("Relu", "Clip"):
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
        if op in LUT_OPS or op in TABULATED_OPS or (op == "Div" and node.input[1] not in self.constants):
            self.table_or_row_op(node, tables.table_op(self, node), "table")
            return
        if op == "Softmax":
            self.table_or_row_op(node, tables.softmax_op(self, node), "table")
            return
        if op in ("LayerNormalization", "LayerNorm"):
            n = self.shapes[node.input[0]][-1]
            self.table_or_row_op(node, tables.layernorm_op(self, node, n), "params")
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
        }[op]
        handler(node, activation)

    def clamp_bounds(self, act: onnx.NodeProto | None, params: TensorParams) -> tuple[int, int]:
        qmin, qmax = qrange(params.bits)
        if act is None:
            return qmin, qmax
        if act.op_type == "Relu":
            lo_f, hi_f = 0.0, math.inf
        else:
            lo_f = float(self.constants[act.input[1]]) if len(act.input) > 1 and act.input[1] else -math.inf
            hi_f = float(self.constants[act.input[2]]) if len(act.input) > 2 and act.input[2] else math.inf
            lo_f = attr(act, "min", lo_f) if self.opset_below_11() else lo_f
            hi_f = attr(act, "max", hi_f) if self.opset_below_11() else hi_f
        lo = qmin if lo_f == -math.inf else max(qmin, int(np.rint(lo_f / params.scale)) + params.zero_point)
        hi = qmax if hi_f == math.inf else min(qmax, int(np.rint(hi_f / params.scale)) + params.zero_point)
        return int(lo), int(hi)

    def opset_below_11(self) -> bool:
        return any(o.domain in ("", "ai.onnx") and o.version < 11 for o in self.model.opset_import)

    def conv(self, node: onnx.NodeProto, activation: onnx.NodeProto | None) -> None:
        transpose = node.op_type == "ConvTranspose"
        x, out = node.input[0], (activation or node).output[0]
        w = self.constants[node.input[1]]
        group = int(attr(node, "group", 1))
        if transpose:
            cout_g = w.shape[1]
            cout = cout_g * group
            # per output channel: for group 1 it is axis 1
            wq, wscale = (
                quantize_weight(w, 1, self.config["per_channel"])
                if group == 1
                else grouped_transpose_scales(w, group)
            )
        else:
            cout = w.shape[0]
            wq, wscale = self.weight_codes(node, w, 0)
        bias = (
            self.constants[node.input[2]].astype(np.float64)
            if len(node.input) > 2 and node.input[2]
            else np.zeros(cout)
        )
        xp, yp = self.params[x], self.params[out]
        spatial = w.ndim - 2
        strides = list(attr(node, "strides", [1] * spatial))
        bias = bias_correction(self.channel_mean(x), w, wq, wscale, bias, group, transpose, strides)
        attrs = {
            "strides": strides,
            "pads": list(attr(node, "pads", [0] * 2 * spatial)),
            "dilations": list(attr(node, "dilations", [1] * spatial)),
            "group": group,
            "transpose": transpose,
            "output_padding": list(attr(node, "output_padding", [0] * spatial)),
            "auto_pad": attr(node, "auto_pad", "NOTSET"),
        }
        self.mac_op("conv", node, x, out, wq, wscale, bias, xp, yp, activation, attrs)

    def mac_op(self, kind, node, x, out, wq, wscale, bias, xp, yp, activation, attrs) -> None:
        prog = self.program
        # a per-channel input grid (a depthwise convolution's, channel c feeding output c)
        acc_scale = np.reshape(xp.channel_scales(), -1) * wscale
        limit = bias_limit(xp.bits)
        bias_q = np.clip(np.rint(bias / acc_scale), -limit - 1, limit).astype(np.int64)
        m0, shift = zip(*(quantize_multiplier(float(s / yp.scale)) for s in acc_scale))
        m0 = np.array(m0, np.int64)
        shift = np.array(shift, np.int64)
        lo, hi = self.clamp_bounds(activation, yp)
        base = f"{kind}/{len(prog.ops)}"
        prog.ops.append(
            {
                "kind": kind,
                "op_type": node.op_type,
                "node": node_label(node),
                "inputs": [x],
                "outputs": [out],
                "attrs": {**attrs, "min": lo, "max": hi},
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
        if node.input[1] not in self.constants:
            self.batch_matmul(node)
            return
        x, out = node.input[0], (activation or node).output[0]
        w = self.constants[node.input[1]]
        if node.op_type == "Gemm" and attr(node, "transB", 0):
            w = w.T
        wq, wscale = self.weight_codes(node, w, 1)
        n = w.shape[1]
        bias = np.zeros(n)
        if node.op_type == "Gemm" and len(node.input) > 2 and node.input[2]:
            bias = np.broadcast_to(self.constants[node.input[2]].astype(np.float64), (n,)).copy()
        mean = self.channel_mean(x)
        if mean is not None and mean.shape == (w.shape[0],):
            bias = bias_correction(mean, w, wq, wscale, bias, 1, False)
        self.mac_op(
            "matmul", node, x, out, wq, wscale, bias, self.params[x], self.params[out], activation, {}
        )

    def batch_matmul(self, node: onnx.NodeProto) -> None:
        """A MatMul of two activations: one multiplier, like an element-wise Mul's."""
        yp = self.params[node.output[0]]
        ap, bp = self.params[node.input[0]], self.params[node.input[1]]
        operands = ((node.input[0], ap, None), (node.input[1], bp, None))
        self.binary_op("batch_matmul", node, operands, product_attrs(ap, bp, yp))

    def operand(self, name: str, bits: int) -> tuple[str, TensorParams, str | None]:
        """A data tensor, or a constant quantized to its own grid (returned as an array key)."""
        if name in self.constants:
            params, q = constant_params(self.constants[name].astype(np.float64), bits)
            key = self.program.add_array(f"const/{len(self.program.ops)}/{name}", q)
            return name, params, key
        return name, self.params[name], None

    def add(self, node: onnx.NodeProto, activation=None) -> None:
        out = node.output[0]
        yp = self.params[out]
        bits = yp.bits
        (a, ap, akey), (b, bp, bkey) = self.operand(node.input[0], bits), self.operand(node.input[1], bits)
        sign = -1 if node.op_type == "Sub" else 1
        attrs = {
            "ma": add_multiplier(ap.scale / yp.scale),
            "mb": sign * add_multiplier(bp.scale / yp.scale),
            "za": ap.zero_point,
            "zb": bp.zero_point,
        }
        self.binary_op("add", node, ((a, ap, akey), (b, bp, bkey)), attrs)

    def mul(self, node: onnx.NodeProto, activation=None) -> None:
        out = node.output[0]
        yp = self.params[out]
        a_name, b_name = node.input[0], node.input[1]
        if node.op_type == "Div":  # x / c == x * (1/c)
            reciprocal = 1.0 / self.constants[b_name].astype(np.float64)
            b_name = f"{b_name}__reciprocal"
            self.constants[b_name] = reciprocal
        (a, ap, akey), (b, bp, bkey) = self.operand(a_name, yp.bits), self.operand(b_name, yp.bits)
        self.binary_op("mul", node, ((a, ap, akey), (b, bp, bkey)), product_attrs(ap, bp, yp))

    def binary_op(self, kind: str, node: onnx.NodeProto, operands, attrs: dict) -> None:
        """An Add or Mul of two operands (name, parameters, constant array key or None)."""
        (a, ap, akey), (b, bp, bkey) = operands
        self.program.ops.append(
            {
                "kind": kind,
                "op_type": node.op_type,
                "node": node_label(node),
                "inputs": [a, b],
                "outputs": [node.output[0]],
                "attrs": attrs,
                "constants": {k: v for k, v in ((a, akey), (b, bkey)) if v},
                "operand_params": [ap.as_dict(), bp.as_dict()],
            }
        )

    def rescale_attrs(self, src: TensorParams, dst: TensorParams) -> dict:
        m0, shift = quantize_multiplier(src.scale / dst.scale)
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
                    "axis": int(attr(node, "axis")),
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
        from npubuild.intmodel.program import PoolAttrs

        x, out = node.input[0], node.output[0]
        xp, yp = self.params[x], self.params[out]
        attrs = {
            "kernel_shape": list(attr(node, "kernel_shape")),
            "strides": list(attr(node, "strides", [1] * len(attr(node, "kernel_shape")))),
            "pads": list(attr(node, "pads", [0] * 2 * len(attr(node, "kernel_shape")))),
            "ceil_mode": int(attr(node, "ceil_mode", 0)),
            "count_include_pad": int(attr(node, "count_include_pad", 0)),
        }
        counts = pool_counts(self.shapes[x][2:], PoolAttrs(**attrs))
        pairs = [quantize_multiplier(xp.scale / (yp.scale * c)) for c in counts.reshape(-1)]
        m0 = np.array([p[0] for p in pairs], np.int64).reshape(counts.shape)
        shift = np.array([p[1] for p in pairs], np.int64).reshape(counts.shape)
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
        self.program.ops.append(
            {
                "kind": "global_avgpool",
                "node": node_label(node),
                "inputs": [x],
                "outputs": [out],
                "attrs": {"m0": m0, "shift": shift},
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
                    "coordinate_transformation_mode": attr(
                        node, "coordinate_transformation_mode", "half_pixel"
                    ),
                    "nearest_mode": attr(node, "nearest_mode", "round_prefer_floor"),
                },
            }
        )

    def table_or_row_op(self, node: onnx.NodeProto, spec: dict, array: str) -> None:
        """Append an op made by tables.py; its integer array `array` goes to the archive."""
        value = spec.pop(array)
        key = self.program.add_array(f"{spec['kind']}/{len(self.program.ops)}", value)
        self.program.ops.append({**spec, "node": node_label(node), "arrays": {array: key}})

    def move_op(self, node: onnx.NodeProto) -> None:
        attrs = node_attributes(node)
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
