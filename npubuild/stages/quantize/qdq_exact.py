"""The integer model's own arithmetic as ONNX ops, for the exact form of the QDQ export.

A QDQ model computes each op in float32 between DequantizeLinear and QuantizeLinear; where float
rounding and the fixed-point rule disagree by one code, deep networks amplify the difference
(PP-OCRv4 det at 320, all int8: a few 1-code flips in 10^5 elements gave an output cosine of
0.9989). Each builder here turns one integer op into nodes that compute its output codes exactly
as `npubuild/intmodel` does, from the input codes (the inputs' QuantizeLinear outputs, `NAME__q`,
read through a DequantizeLinear of scale 1: the centred codes), and writes the output codes
`NAME__q` itself (a QuantizeLinear of scale 1 and the output's zero point rounds nothing and
saturates; the export then leaves out that tensor's own QuantizeLinear). A builder returns None
when it cannot prove its arithmetic exact; the export then keeps the standard DequantizeLinear ->
op -> QuantizeLinear form for that op.

Exactness comes from bounds, as in `intmodel/ortconv.py` and `fixedpoint.requantize_output`:
float32 holds integers below 2^24, so a convolution of centred codes with integer weights is exact
in any summation order when max |x~| times the largest L1 norm of one output's weights stays below
it (a 16-bit input is split in bytes, two convolutions); float64 holds integers below 2^53, so
`(acc + bias) * M0 * 2^-n` rounds exactly when the product stays below 2^52, and
`sign(v) * floor(|v| + 1/2)` is rounding half away from zero. Larger products (16-bit layers) take
int64 nodes with the 24-bit split of `fixedpoint._requantize_wide`.

- `lut`: a Gather of the table's dequantized values at the input codes.
- `add`: `add_codes`: a~ ma 2^-20 + b~ mb 2^-20 rounded, zero point, saturation.
- `mac` (Conv, ConvTranspose, MatMul, Gemm): convolution, bias, requantization, clamp.
- `global_avgpool`: the sum of the centred codes, requantized.
- `batch_matmul`: the product of two activations' centred codes in float64, requantized.
- `layernorm`: the row sums, integer square root and rounded division of `rowwise.layernorm_rows`
  in int64 ops, then each element's multiplier and bias (2026-11-25: ViT's export had agreed with
  its integer model at cosine 0.9989, the float LayerNorm off by one code on a quarter of its
  elements; now 0.9997).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper

from npubuild.intmodel.codes import qrange
from npubuild.intmodel.fixedpoint import ADD_FRACTION_BITS, FLOAT64_EXACT_PRODUCT
from npubuild.intmodel.ortconv import BYTE, FLOAT32_EXACT, channel_l1
from npubuild.intmodel.program import IntegerModel, Op
from npubuild.intmodel.rowwise import D_LIMIT_BITS, SOFTMAX_GRID, Z_FRACTION_BITS
from npubuild.stages.quantize.requant_nodes import requantization, rounding


class ExactOps:
    def __init__(
        self,
        program: IntegerModel,
        arrays: dict[str, np.ndarray],
        init: Callable[[str, np.ndarray], str],
        named: Callable[[str, str], str],
        opset: int = 13,
        shapes: dict[str, list[int]] | None = None,
    ):
        self.program, self.arrays, self._init = program, arrays, init
        self.shapes = shapes or {}  # the float model's tensor shapes, where it records them
        self.opset = opset  # the model's: ReduceMax takes its axes as an input from opset 18
        self._named = named  # the name of a part of a tensor or op (qdq._Export._named)
        self._made: set[str] = set()  # per-tensor helpers (centred codes) already in the graph
        self.uses_ms = False  # 16-bit QuantizeLinear/DequantizeLinear (com.microsoft) were used
        self.written: set[str] = set()  # tensors whose codes (NAME__q) an exact op writes itself

    def _const(self, label: str, name: str, value, dtype=np.float64) -> str:
        return self._init(self._named(label, name), np.asarray(value, dtype))

    def _unit_grid(self, name: str) -> tuple[str, str, str]:
        """(scale 1, the tensor's zero point, the Q/DQ domain) of tensor `name`'s codes."""
        t = self.program.tensors[name]
        scale, zp = self._named(name, "unit__scale"), self._named(name, "unit__zp")
        if scale not in self._made:  # once per tensor: its producer and its readers share them
            self._made.add(scale)
            self.uses_ms |= t.bits == 16
            self._init(zp, np.asarray(t.zero_point, np.int8 if t.bits == 8 else np.int16))
            self._init(scale, np.asarray(1.0, np.float32))
        return scale, zp, "" if t.bits == 8 else "com.microsoft"

    def _centred(self, name: str, dtype: int) -> tuple[str, list[onnx.NodeProto]]:
        """Tensor `name`'s codes minus its zero point, as float32 or float64 (exact either way),
        made once per tensor and shared by every op that reads it."""
        f32 = self._named(name, "centred_f32")
        out = f32 if dtype == TensorProto.FLOAT else self._named(name, "centred_f64")
        nodes = []
        if f32 not in self._made:
            self._made.add(f32)
            scale, zp, domain = self._unit_grid(name)
            nodes.append(
                helper.make_node(
                    "DequantizeLinear", [self._named(name, "q"), scale, zp], [f32], domain=domain
                )
            )
        if out not in self._made:
            self._made.add(out)
            nodes.append(helper.make_node("Cast", [f32], [out], to=dtype))
        return out, nodes

    def _operand(self, label: str, op: Op, k: int) -> tuple[str, list[onnx.NodeProto]]:
        """Operand k of `op` centred, in float64: a constant's stored codes, else the tensor's."""
        name = op.inputs[k]
        if name in op.constants:
            zero_point = op.operand_params[k].zero_point
            centred = self.arrays[op.constants[name]].astype(np.int64) - zero_point
            return self._const(label, f"{k}_centred", centred), []
        return self._centred(name, TensorProto.DOUBLE)

    def _round(self, label: str, value: str) -> list[onnx.NodeProto]:
        """float64 `value` rounded half away from zero: `LABEL__rounded` (requant_nodes.rounding)."""
        return rounding(self._const, self._named, label, value)

    def _requantize(
        self, label: str, bound: float, m0: np.ndarray, shift: np.ndarray, per_channel: tuple[int, ...]
    ):
        """requant_nodes.requantization for this export's names and constants."""
        return requantization(self._const, self._named, label, bound, m0, shift, per_channel)

    def _leave(self, label: str, rounded: str, op: Op, lo: int, hi: int) -> list[onnx.NodeProto]:
        """Rounded float64 values (before the zero point) as the output codes `OUT__q`: in float32
        (exact below 2^24; anything larger saturates either way), clamped when [lo, hi] (a fused
        Relu or Clip) is narrower than the codes' range, then a QuantizeLinear of scale 1 adds
        the zero point and saturates."""
        name = op.outputs[0]
        self.written.add(name)
        t = self.program.tensors[name]
        nodes = [
            helper.make_node("Cast", [rounded], [self._named(label, "rounded_f32")], to=TensorProto.FLOAT)
        ]
        value = self._named(label, "rounded_f32")
        if (lo, hi) != qrange(t.bits):
            bounds = [
                self._const(label, end, v - t.zero_point, np.float32) for end, v in (("lo", lo), ("hi", hi))
            ]
            nodes.append(helper.make_node("Clip", [value, *bounds], [self._named(label, "clamped")]))
            value = self._named(label, "clamped")
        scale, zp, domain = self._unit_grid(name)
        nodes.append(
            helper.make_node(
                "QuantizeLinear",
                [value, scale, zp],
                [self._named(name, "q")],
                name=self._named(label, "codes"),
                domain=domain,
            )
        )
        return nodes

    def lut(self, node: onnx.NodeProto, op: Op) -> list[onnx.NodeProto]:
        label = node.name or node.output[0]
        t = self.program.tensors[op.outputs[0]]
        table = self.arrays[op.arrays.table].astype(np.int8 if t.bits == 8 else np.int16)
        self.written.add(op.outputs[0])
        offset = self._const(label, "offset", op.attrs.offset, np.int64)
        nodes = [
            helper.make_node(
                "Cast", [self._named(op.inputs[0], "q")], [self._named(label, "codes")], to=TensorProto.INT64
            ),
            helper.make_node("Add", [self._named(label, "codes"), offset], [self._named(label, "index")]),
        ]
        if op.attrs.index_shift:  # the index is >= 0: integer division is the shift
            step = self._const(label, "step", 1 << op.attrs.index_shift, np.int64)
            nodes.append(
                helper.make_node("Div", [self._named(label, "index"), step], [self._named(label, "entry")])
            )
        index = self._named(label, "entry") if op.attrs.index_shift else self._named(label, "index")
        if not t.channel_shifts:
            return [
                *nodes,
                helper.make_node(
                    "Gather",
                    [self._init(self._named(label, "table"), table), index],
                    [self._named(op.outputs[0], "q")],
                    name=label,
                ),
            ]
        # a per-channel grid: the 16-bit entries, each channel's shifted right (rounded half away
        # from zero: exact in float64), saturated to int8 by the QuantizeLinear of scale 1
        entries = self.arrays[op.arrays.table].astype(np.float64)
        return [
            *nodes,
            helper.make_node(
                "Gather",
                [self._const(label, "table", entries), index],
                [self._named(label, "entries")],
                name=label,
            ),
            *self._channel_shifted(label, self._named(label, "entries"), op),
        ]

    def add(self, node: onnx.NodeProto, op: Op) -> list[onnx.NodeProto] | None:
        """Exact in float64 while |a~| ma + |b~| mb stays below 2^52: the sum, its scaling by
        2^-20 and the rounding."""
        label = node.name or node.output[0]
        at = op.attrs
        widest = sum(
            abs(m) * (2 ** (self.program.tensors[i].bits if i in self.program.tensors else 16))
            for i, m in zip(op.inputs, (at.ma, at.mb))
        )
        if widest >= FLOAT64_EXACT_PRODUCT:
            return None
        nodes: list[onnx.NodeProto] = []
        scaled = []
        for k, multiplier in enumerate((at.ma, at.mb)):
            centred, made = self._operand(label, op, k)
            factor = self._const(label, f"m{k}", np.ldexp(float(multiplier), -ADD_FRACTION_BITS))
            nodes += [*made, helper.make_node("Mul", [centred, factor], [self._named(label, f"s{k}")])]
            scaled.append(self._named(label, f"s{k}"))
        nodes.append(helper.make_node("Add", scaled, [self._named(label, "sum")]))
        nodes += self._round(label, self._named(label, "sum"))
        out = self.program.tensors[op.outputs[0]]
        if out.channel_shifts:
            return nodes + self._channel_shifted(label, self._named(label, "rounded"), op)
        lo, hi = qrange(out.bits)
        return nodes + self._leave(label, self._named(label, "rounded"), op, lo, hi)

    def _channel_shifted(self, label: str, base_codes: str, op: Op) -> list[onnx.NodeProto]:
        """A per-channel result's codes from its rounded codes on the base grid (float64, before
        saturation to 16 bits): saturated, each channel shifted right (rounded half away from
        zero), saturated to int8 (intmodel/fixedpoint.channel_shifted)."""
        shifts = self.program.tensors[op.outputs[0]].channel_shifts
        lo, hi = qrange(16)
        scales = np.exp2(-np.asarray(shifts, np.float64)).reshape(1, -1, 1, 1)
        bounds = [self._const(label, end, v) for end, v in (("wide_lo", lo), ("wide_hi", hi))]
        return [
            helper.make_node("Clip", [base_codes, *bounds], [self._named(label, "wide")]),
            helper.make_node(
                "Mul",
                [self._named(label, "wide"), self._const(label, "shifts", scales)],
                [self._named(label, "shifted")],
            ),
            *self._round(self._named(label, "channel"), self._named(label, "shifted")),
            *self._leave(label, self._named(self._named(label, "channel"), "rounded"), op, *qrange(8)),
        ]

    def mac(self, node: onnx.NodeProto, op: Op) -> list[onnx.NodeProto] | None:
        if node.op_type not in ("Conv", "ConvTranspose", "MatMul", "Gemm"):
            return None
        if node.op_type == "Gemm" and any(
            (at.name in ("alpha", "beta") and at.f != 1.0) or (at.name == "transA" and at.i)
            for at in node.attribute
        ):
            return None
        a = op.arrays
        label = node.name or node.output[0]
        xt = self.program.tensors[op.inputs[0]]
        wq = self.arrays[a.weight]
        transpose = node.op_type == "ConvTranspose"
        matmul = node.op_type in ("MatMul", "Gemm")
        if transpose and op.attrs.group != 1:
            return None
        # the largest L1 norm of one output's weights: matmul weights are [K, N], outputs along N
        l1 = (
            float(np.abs(wq.astype(np.int64)).sum(axis=0).max(initial=0))
            if matmul
            else channel_l1(wq, transpose)
        )
        if BYTE * l1 >= FLOAT32_EXACT:
            return None
        bias = self.arrays[a.bias].astype(np.int64)
        lo_x, hi_x = qrange(xt.bits)
        bound = (hi_x - lo_x) * l1 + float(np.abs(bias).max(initial=0))
        per_channel = (-1,) if matmul else (-1,) + (1,) * (wq.ndim - 2)
        requantize = self._requantize(label, bound, self.arrays[a.m0], self.arrays[a.shift], per_channel)
        if requantize is None:
            return None
        # matmul weights are [K, N] for MatMul and Gemm alike (a Gemm becomes a MatMul here)
        w_float = self._init(self._named(label, "weight_codes"), wq.astype(np.float32))
        x, nodes = self._centred(op.inputs[0], TensorProto.FLOAT)

        # an int8 input's sums with the bias stay below 2^24 too (the usual case): the Conv adds it
        bias_in_conv = xt.bits == 8 and bound < FLOAT32_EXACT and node.op_type in ("Conv", "ConvTranspose")

        def summed(source: str, part: str) -> list[onnx.NodeProto]:
            """The op itself on float32 integers as float64 `LABEL__PART_acc`."""
            copy = onnx.NodeProto()
            copy.CopyFrom(node)
            copy.name = self._named(label, part)
            del copy.input[:]
            copy.input.extend([source, w_float])
            if bias_in_conv:
                copy.input.append(self._const(label, "bias_f32", bias, np.float32))
            copy.output[:] = [self._named(label, f"{part}_sum")]
            if node.op_type == "Gemm":
                del copy.attribute[:]
                copy.op_type = "MatMul"
            return [
                copy,
                helper.make_node(
                    "Cast",
                    [self._named(label, f"{part}_sum")],
                    [self._named(label, f"{part}_acc")],
                    to=TensorProto.DOUBLE,
                ),
            ]

        if xt.bits == 8:
            nodes += summed(x, "all")
            acc = self._named(label, "all_acc")
        else:  # x~ = 256 high + low, low in [0, 255]: each half's sums stay below 2^24
            byte = self._const(label, "byte", BYTE, np.float32)
            nodes += [  # x / 256 as a product by 2^-8: exact, and cheaper than a division
                helper.make_node(
                    "Mul",
                    [x, self._const(label, "per_byte", 1.0 / BYTE, np.float32)],
                    [self._named(label, "x_scaled")],
                ),
                helper.make_node("Floor", [self._named(label, "x_scaled")], [self._named(label, "x_high")]),
                helper.make_node(
                    "Mul", [self._named(label, "x_high"), byte], [self._named(label, "x_high_part")]
                ),
                helper.make_node(
                    "Sub", [x, self._named(label, "x_high_part")], [self._named(label, "x_low")]
                ),
                *summed(self._named(label, "x_high"), "high"),
                *summed(self._named(label, "x_low"), "low"),
                helper.make_node(
                    "Mul",
                    [self._named(label, "high_acc"), self._const(label, "byte64", BYTE)],
                    [self._named(label, "high_scaled")],
                ),
                helper.make_node(
                    "Add",
                    [self._named(label, "high_scaled"), self._named(label, "low_acc")],
                    [self._named(label, "acc")],
                ),
            ]
            acc = self._named(label, "acc")
        if bias_in_conv:
            value = acc
        else:
            value = self._named(label, "value")
            nodes.append(
                helper.make_node("Add", [acc, self._const(label, "bias", bias.reshape(per_channel))], [value])
            )
        nodes += requantize(value)
        return nodes + self._leave(label, self._named(label, "rounded"), op, op.attrs.min, op.attrs.max)

    def global_avgpool(self, node: onnx.NodeProto, op: Op) -> list[onnx.NodeProto] | None:
        label = node.name or node.output[0]
        xt, yt = self.program.tensors[op.inputs[0]], self.program.tensors[op.outputs[0]]
        lo, hi = qrange(xt.bits)
        # the multiplier is s_x / (s_y * count): the count it implies, doubled, bounds the sum's terms
        multiplier = np.ldexp(float(op.attrs.m0), -(31 + op.attrs.shift))
        count_bound = 2 * xt.scale / (yt.scale * multiplier) if multiplier else 0.0
        requantize = self._requantize(
            label, (hi - lo) * count_bound, np.array([op.attrs.m0]), np.array([op.attrs.shift]), (1,)
        )
        if requantize is None:
            return None
        x, nodes = self._centred(op.inputs[0], TensorProto.DOUBLE)
        nodes += [
            helper.make_node(
                "ReduceSum",
                [x, self._const(label, "axes", [2, 3], np.int64)],
                [self._named(label, "value")],
                keepdims=1,
            ),
            *requantize(self._named(label, "value")),
        ]
        return nodes + self._leave(label, self._named(label, "rounded"), op, *qrange(yt.bits))

    def batch_matmul(self, node: onnx.NodeProto, op: Op) -> list[onnx.NodeProto] | None:
        """A MatMul of two activations (attention's Q K^T and P V): the centred codes multiplied
        in float64, exact while the inner size times the largest centred codes stays below 2^53
        (in float32, int16 probabilities times int8 values over 197 tokens reach 2^30 and round),
        then requantized. None where the inner size is not known or an operand has per-channel
        grids."""
        label = node.name or node.output[0]
        (a, b), at = op.inputs, op.attrs
        ta, tb, ty = (self.program.tensors[n] for n in (a, b, op.outputs[0]))
        shape = self.shapes.get(a)
        if (
            not shape
            or shape[-1] <= 0
            or ta.channel_shifts
            or tb.channel_shifts
            or ty.channel_shifts
            or (at.za, at.zb) != (ta.zero_point, tb.zero_point)
        ):
            return None

        def largest(t) -> int:  # of a centred code
            return max(abs(end - t.zero_point) for end in qrange(t.bits))

        bound = float(shape[-1]) * largest(ta) * largest(tb)
        if bound >= 2.0**53:  # the float64 product itself would round
            return None
        requantize = self._requantize(label, bound, np.array([at.m0]), np.array([at.shift]), (1,))
        if requantize is None:
            return None
        xa, nodes = self._centred(a, TensorProto.DOUBLE)
        xb, more = self._centred(b, TensorProto.DOUBLE)
        nodes += more
        nodes.append(helper.make_node("MatMul", [xa, xb], [self._named(label, "value")]))
        nodes += requantize(self._named(label, "value"))
        return nodes + self._leave(label, self._named(label, "rounded"), op, *qrange(ty.bits))

    def _builder(self, label: str, nodes: list[onnx.NodeProto]):
        """(make, const) for an op rewritten node by node: `make` appends a node whose one output
        is named after `label` and returns that name; `const` makes an int64 initializer."""

        def make(kind: str, inputs: list[str], out: str, **attrs) -> str:
            nodes.append(helper.make_node(kind, inputs, [self._named(label, out)], **attrs))
            return self._named(label, out)

        def const(name: str, value) -> str:
            return self._const(label, name, value, np.int64)

        return make, const

    def layernorm(self, node: onnx.NodeProto, op: Op) -> list[onnx.NodeProto] | None:
        """`layernorm_rows` (intmodel/rowwise.py) in int64 ops: the row's sums S and SS of the
        centred codes, t = n xc - S, D = n SS - S^2 + E, p = max((bits(D) - 45) // 2, 0) (bits
        counted by comparisons with every power of two: a float log2 can round across one),
        isqrt((D >> 2p) << 16) (a float64 square root corrected by one either way, as `isqrt`),
        z = t 2^(20 - p) / that, rounded half away from zero; then each element's multiplier
        (`_requantize`: None where no form is exact, and the standard form stays), its bias codes."""
        label = node.name or node.output[0]
        yt = self.program.tensors[op.outputs[0]]
        params = self.arrays[op.arrays.params].astype(np.int64)
        n = len(params)
        m0, shift, bias = params[:, 0], params[:, 1], params[:, 2]
        # rounding half away from zero is odd: a negative multiplier's result is the magnitude's
        # negated, so the requantization runs on |m0| and the sign multiplies after
        requantize = self._requantize(
            label, 2.0 * math.sqrt(n) * (1 << (Z_FRACTION_BITS + 8)), np.abs(m0), shift, (n,)
        )
        if requantize is None:
            return None
        centred, nodes = self._centred(op.inputs[0], TensorProto.DOUBLE)
        i64, f64 = TensorProto.INT64, TensorProto.DOUBLE
        make, const = self._builder(label, nodes)
        two_f = self._const(label, "two_f", 2.0)

        def pow2(exponent: str, out: str) -> str:  # 2^e as int64, e a float64 integer in [0, 62]
            return make("Cast", [make("Pow", [two_f, exponent], f"{out}_f")], out, to=i64)

        last, one, two = const("last_axis", [-1]), const("one", 1), const("two", 2)
        xc = make("Cast", [centred], "xc", to=i64)
        s = make("ReduceSum", [xc, last], "s", keepdims=1)
        ss = make("ReduceSum", [make("Mul", [xc, xc], "xc2"), last], "ss", keepdims=1)
        t_ = make("Sub", [make("Mul", [xc, const("n", n)], "nxc"), s], "t")
        var = make("Sub", [make("Mul", [ss, const("n2", n)], "nss"), make("Mul", [s, s], "s2")], "var")
        d = make("Add", [var, const("eps", max(int(op.attrs.eps_codes), 1))], "d")
        powers = const("powers", np.left_shift(np.int64(1), np.arange(63, dtype=np.int64)))
        reached = make("GreaterOrEqual", [make("Unsqueeze", [d, last], "d_col"), powers], "reached")
        bits = make("ReduceSum", [make("Cast", [reached], "reached64", to=i64), last], "bits", keepdims=0)
        over = make("Div", [make("Sub", [bits, const("limit", D_LIMIT_BITS - 1)], "over"), two], "half_over")
        p_f = make("Cast", [make("Max", [over, const("zero", 0)], "p")], "p_f", to=f64)
        drop = pow2(make("Add", [p_f, p_f], "two_p"), "drop")
        v = make("Mul", [make("Div", [d, drop], "d_kept"), const("q16", 1 << 16)], "v")
        root = make("Floor", [make("Sqrt", [make("Cast", [v], "v_f", to=f64)], "root_f")], "floor_f")
        r = make("Cast", [root], "r0", to=i64)
        for k in range(2):  # r * r > v: one less, twice
            above = make("Greater", [make("Mul", [r, r], f"r2_{k}"), v], f"gt_{k}")
            r = make("Sub", [r, make("Cast", [above], f"gt64_{k}", to=i64)], f"r{k + 1}")
        r_up = make("Add", [r, one], "r_up")
        under = make("LessOrEqual", [make("Mul", [r_up, r_up], "r_up2"), v], "le")
        sd = make("Max", [make("Add", [r, make("Cast", [under], "le64", to=i64)], "r3"), one], "sd")
        z_bits = make("Sub", [self._const(label, "q_bits", float(Z_FRACTION_BITS + 8)), p_f], "z_bits")
        num = make("Mul", [t_, pow2(z_bits, "z_scale")], "num")
        twice = make("Add", [make("Mul", [make("Abs", [num], "num_abs"), two], "num2"), sd], "num_biased")
        mag = make("Div", [twice, make("Mul", [sd, two], "sd2")], "mag")
        z = make("Cast", [make("Mul", [mag, make("Sign", [num], "num_sign")], "z64")], "z", to=f64)
        nodes += requantize(z)
        sign = self._const(label, "m0_sign", np.sign(m0).astype(np.float64))
        signed = make("Mul", [self._named(label, "rounded"), sign], "signed")
        value = make("Add", [signed, self._const(label, "bias", bias.astype(np.float64))], "codes")
        return nodes + self._leave(label, value, op, *qrange(yt.bits))

    def softmax(self, node: onnx.NodeProto, op: Op) -> list[onnx.NodeProto]:
        """`softmax_rows` (intmodel/rowwise.py) in int64 ops: d = max(row) - x, its table entry
        (d >> rshift, the last entry past the table), the row's sum S (at least 1), and
        y = (2 e Q + S) // (2 S), Q = 1 / the output grid's step; a float Softmax between Q/DQ
        pairs differs from the table by a code on the int16 grid, which the int16 MatMul after it
        carries on."""
        label = node.name or node.output[0]
        table = self.arrays[op.arrays.table].astype(np.int64)
        out_bits = self.program.tensors[op.outputs[0]].bits
        grid_step, _ = SOFTMAX_GRID[out_bits]
        q = round(1 / grid_step)
        centred, nodes = self._centred(op.inputs[0], TensorProto.DOUBLE)  # the zero point cancels
        make, const = self._builder(label, nodes)
        x = make("Cast", [centred], "x", to=TensorProto.INT64)
        if self.opset >= 18:
            peak = make("ReduceMax", [x, const("last_axis", [-1])], "peak", keepdims=1)
        else:
            peak = make("ReduceMax", [x], "peak", axes=[-1], keepdims=1)
        d = make("Sub", [peak, x], "d")
        index = make(
            "Min",
            [
                make("Div", [d, const("step", 1 << op.attrs.rshift)], "d_shifted"),
                const("last", table.size - 1),
            ],
            "index",
        )
        e = make("Gather", [const("table", table), index], "e")
        total = make(
            "Max", [make("ReduceSum", [e, const("axis", [-1])], "sum", keepdims=1), const("one", 1)], "total"
        )
        num = make("Add", [make("Mul", [e, const("two_q", 2 * q)], "e2q"), total], "num")
        y = make("Div", [num, make("Mul", [total, const("two", 2)], "total2")], "y")
        value = make("Cast", [y], "y_f64", to=TensorProto.DOUBLE)
        return nodes + self._leave(label, value, op, *qrange(out_bits))
