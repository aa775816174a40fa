"""What runs where, decided in one place: named constraints, each one rule, checked in order.

Two lists. `INTEGER_FORM` is asked by quantize about an ONNX node: does the integer model have a
rule for it (else the node stays float, on the CPU). `NPU` is asked by partition about an integer
op and a target: can this NPU run it (else the op runs on the CPU). A constraint returns None when
the op satisfies it, else the sentence the user reads in the build summary and the partition
plan; its docstring says the rule. The first constraint that fails gives the reason.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from npubuild.intmodel.ops import ALIASES, ELEMENTWISE, INTEGER_OPS, MAC_OPS, TABULATED_OPS
from npubuild.intmodel.program import IntegerModel, MoveOp, Op
from npubuild.targets.spec import TargetSpec

# integer-form constraints -----------------------------------------------------------------------


@dataclass(frozen=True)
class NodeView:
    """An ONNX node as the integer-form constraints read it (no onnx import needed here)."""

    node: Any  # onnx.NodeProto
    attr: Callable[[str, Any], Any]  # attribute value by name, or the default
    constants: dict  # names of constant tensors -> arrays
    shapes: dict | None = None  # tensor name -> shape, where known

    def rank(self, name: str) -> int | None:
        shape = (self.shapes or {}).get(name)
        return len(shape) if shape else None

    @property
    def op(self) -> str:
        return self.node.op_type

    def constant(self, name: str) -> bool:
        return name in self.constants


IntegerConstraint = Callable[[NodeView], "str | None"]
INTEGER_FORM: list[IntegerConstraint] = []


def _integer(fn: IntegerConstraint) -> IntegerConstraint:
    INTEGER_FORM.append(fn)
    return fn


@_integer
def has_integer_rule(v: NodeView) -> str | None:
    """The integer model has rules for MAC ops, element-wise arithmetic, lookup-table functions,
    data movement, Concat, pooling, nearest Resize, Relu and Clip; anything else stays float."""
    return None if v.op in INTEGER_OPS else f"no integer rule for {v.op}"


@_integer
def standard_domain(v: NodeView) -> str | None:
    """Only ONNX's own ops (and npubuild's fused ones) have integer rules."""
    domain = v.node.domain
    return None if domain in ("", "ai.onnx", "npubuild") else f"unknown domain {domain}"


@_integer
def constant_weights(v: NodeView) -> str | None:
    """A MAC op's weights are quantized per channel ahead of time, so they must be constant."""
    inputs = v.node.input
    if v.op == "MatMul" and len(inputs) == 2 and not v.constant(inputs[0]) and not v.constant(inputs[1]):
        return None  # two activations: a batch_matmul, both sides quantized per tensor
    if v.op in MAC_OPS and (len(inputs) < 2 or not v.constant(inputs[1])):
        return f"{v.op} with a non-constant weight"
    return None


@_integer
def activation_matmul_of_matrices(v: NodeView) -> str | None:
    """A MatMul of two activations multiplies matrices (rank >= 2 on both sides)."""
    inputs = v.node.input
    if v.op != "MatMul" or v.constant(inputs[1]):
        return None
    ranks = [v.rank(i) for i in inputs[:2]]
    if any(r is not None and r < 2 for r in ranks):
        return "MatMul of two activations that are not matrices"
    return None


@_integer
def plain_gemm(v: NodeView) -> str | None:
    """Gemm runs as a plain matrix product: no transposed A, alpha and beta of 1."""
    if v.op == "Gemm" and (v.attr("transA", 0) or v.attr("alpha", 1.0) != 1.0 or v.attr("beta", 1.0) != 1.0):
        return "Gemm with transA/alpha/beta"
    return None


@_integer
def matrix_weights(v: NodeView) -> str | None:
    """A MatMul's constant operand must be a 2-D matrix."""
    if v.op == "MatMul" and v.constant(v.node.input[1]) and v.constants[v.node.input[1]].ndim != 2:
        return "MatMul with a weight that is not 2-D"
    return None


@_integer
def constant_divisor(v: NodeView) -> str | None:
    """Div is a multiplication by the divisor's reciprocal, so the divisor must be constant, or
    the dividend a constant scalar (c / x is then a function of x, a lookup table)."""
    if v.op != "Div" or v.constant(v.node.input[1]):
        return None
    dividend = v.node.input[0]
    if v.constant(dividend) and v.constants[dividend].size == 1:
        return None
    return "Div by a tensor"


@_integer
def tabulated_function_of_one_tensor(v: NodeView) -> str | None:
    """A function tabulated over its input's codes (Pow, Erf, Exp, GELU, ...) has one tensor
    input; its other inputs (Pow's exponent) must be constant scalars."""
    if v.op not in TABULATED_OPS:
        return None
    data = [i for i in v.node.input if i and not v.constant(i)]
    if len(data) != 1:
        return f"{v.op} of {len(data)} tensors"
    if any(i and v.constant(i) and v.constants[i].size != 1 for i in v.node.input):
        return f"{v.op} with a constant that is not a scalar"
    return None


def _last_axis(v: NodeView, axis: int) -> bool:
    rank = v.rank(v.node.input[0])
    return axis == -1 or (rank is not None and axis == rank - 1)


@_integer
def softmax_over_last_axis(v: NodeView) -> str | None:
    """Softmax runs row by row over the last, contiguous axis (opset 13 semantics)."""
    if v.op == "Softmax" and not _last_axis(v, v.attr("axis", -1)):
        return "Softmax over an axis that is not the last"
    return None


@_integer
def layernorm_over_last_axis(v: NodeView) -> str | None:
    """LayerNormalization runs row by row over the last axis, with constant scale and bias."""
    if v.op not in ("LayerNormalization", "LayerNorm"):
        return None
    if not _last_axis(v, v.attr("axis", -1)):
        return "LayerNormalization over more than the last axis"
    if any(i and not v.constant(i) for i in v.node.input[1:]):
        return "LayerNormalization with a non-constant scale or bias"
    if len([o for o in v.node.output if o]) > 1:
        return "LayerNormalization with mean or inverse deviation outputs"
    return None


@_integer
def not_all_constant(v: NodeView) -> str | None:
    """An element-wise op of constants only is folded by optimize, not computed in integers."""
    if v.op in ELEMENTWISE and all(v.constant(i) for i in v.node.input):
        return "all inputs constant"
    return None


@_integer
def nearest_resize(v: NodeView) -> str | None:
    """Resize runs as nearest-neighbour index arithmetic with asymmetric or half-pixel coordinates."""
    if v.op != "Resize":
        return None
    if v.attr("mode", "nearest") != "nearest":
        return f"Resize mode {v.attr('mode', None)}"
    if v.attr("coordinate_transformation_mode", "half_pixel") not in ("asymmetric", "half_pixel"):
        return "Resize coordinate mode"
    return None


@_integer
def constant_clip_bounds(v: NodeView) -> str | None:
    """Clip's bounds become integer codes ahead of time, so they must be constant."""
    if v.op == "Clip" and any(i and not v.constant(i) for i in v.node.input[1:]):
        return "Clip with tensor bounds"
    return None


@_integer
def constant_move_parameters(v: NodeView) -> str | None:
    """Shapes, split sizes and slice bounds must be known when the model is compiled."""
    if v.op in ("Split", "Slice", "Reshape", "Squeeze", "Unsqueeze") and any(
        i and not v.constant(i) for i in v.node.input[1:]
    ):
        return f"{v.op} with non-constant parameters"
    return None


@_integer
def simple_average_pool(v: NodeView) -> str | None:
    """AveragePool divides by fixed window counts: explicit or VALID padding, no dilations."""
    if v.op == "AveragePool" and (
        v.attr("auto_pad", "NOTSET") not in ("NOTSET", "VALID")
        or any(d != 1 for d in v.attr("dilations", []))
    ):
        return "AveragePool with SAME padding or dilations"
    return None


@_integer
def max_pool_without_indices(v: NodeView) -> str | None:
    """MaxPool's optional indices output has no integer form."""
    if v.op == "MaxPool" and len(v.node.output) > 1 and v.node.output[1]:
        return "MaxPool with indices"
    return None


def integer_blocker(
    node: Any, attr: Callable[[str, Any], Any], constants: dict, shapes: dict | None = None
) -> str:
    """Why the node has no integer form ('' when it has one)."""
    view = NodeView(node, attr, constants, shapes)
    for constraint in INTEGER_FORM:
        reason = constraint(view)
        if reason:
            return reason
    return ""


# NPU constraints -------------------------------------------------------------------------------

# integer op kinds and the ONNX op types the target must list for them
_KIND_OPS = {
    "concat": ("Concat",),
    "global_avgpool": ("GlobalAveragePool",),
    "avgpool": ("AveragePool",),
    "resize_nearest": ("Resize",),
    "softmax": ("Softmax",),
    "layernorm": ("LayerNormalization",),
}
_COPIES = ("Transpose", "Slice", "Split")
MOVES = ALIASES + _COPIES + ("MaxPool",)


@dataclass(frozen=True)
class OpView:
    """An integer op in its program, as the NPU constraints read it."""

    op: Op
    program: IntegerModel
    arrays: dict
    shapes: dict
    target: TargetSpec
    fits: Callable[[Op], bool] | None = None  # the code generator's: does a tiling exist

    @property
    def kind(self) -> str:
        return self.op.kind

    def rank(self, name: str) -> int:
        return len(self.shapes.get(name, []))


NpuConstraint = Callable[[OpView], "str | None"]
NPU: list[NpuConstraint] = []


def _npu(fn: NpuConstraint) -> NpuConstraint:
    NPU.append(fn)
    return fn


@_npu
def integer_op(v: OpView) -> str | None:
    """The NPU computes integers only: an op the quantizer left float runs on the CPU, for the
    reason the quantizer gave (no integer rule for its type, a non-constant weight, an override)."""
    if v.kind != "float":
        return None
    why = next((f.reason for f in v.program.float_nodes if f.node == v.op.node), "")
    return (
        f"{v.op.op_type} stays float: {why}"
        if why
        else f"{v.op.op_type} has no integer form (it stays float)"
    )


@_npu
def not_a_float_conversion(v: OpView) -> str | None:
    """Converting a float network input (or float result) to codes runs on the CPU, where the
    float value is."""
    return (
        "float-to-integer conversion of a network input or a float result" if v.kind == "quantize" else None
    )


@_npu
def supported_widths(v: OpView) -> str | None:
    """Every activation width the op touches must be one the target computes with."""
    tensors = v.program.tensors
    widths = {f"int{tensors[n].bits}" for n in [*v.op.inputs, *v.op.outputs] if n in tensors}
    missing = sorted(widths - set(v.target.activation_dtypes))
    return f"{v.target.name} has no {', '.join(missing)} activations" if missing else None


@_npu
def supported_op_type(v: OpView) -> str | None:
    """The target must list the op's ONNX type (Div, Sub, Relu and Clip ride on Mul, Add and the
    requantization's clamp, which every target has; Reshape-like ops are another name for their
    input's buffer and need nothing of the target)."""
    op_type = v.op.op_type
    if v.kind == "move" and op_type in ALIASES:
        return None
    if v.kind in ("conv", "matmul", "batch_matmul", "add", "mul", "lut") or (v.kind == "move" and op_type):
        if op_type not in v.target.supported_ops and op_type not in ("Div", "Sub", "Relu", "Clip"):
            return f"{v.target.name} does not support {op_type}"
    needed = _KIND_OPS.get(v.kind)
    if needed and not any(t in v.target.supported_ops for t in needed):
        return f"{v.target.name} does not support {needed[0]}"
    return None


@_npu
def per_channel_results_from_tables(v: OpView) -> str | None:
    """A result with a grid per channel (a depthwise convolution's input) is a lookup table's
    16-bit entries shifted per channel, in the table or in a convolution's output path; an Add or
    a Mul that makes one (a scalar scale or bias the table did not absorb) has no such step."""
    made = [n for n in v.op.outputs if n in v.program.tensors and v.program.tensors[n].channel_shifts]
    if made and v.kind != "lut":
        return f"{v.op.op_type} with a per-channel result grid (only a table shifts per channel)"
    return None


@_npu
def rank_at_most_4(v: OpView) -> str | None:
    """DMA descriptors address at most four dimensions (a Reshape-like view moves nothing)."""
    if v.kind == "move" and v.op.op_type in ALIASES:
        return None
    data = [n for n in v.op.inputs if n and n not in v.op.constants]
    if any(v.rank(n) > 4 for n in data + v.op.outputs if n):
        return "tensors of rank above 4"
    return None


@_npu
def two_d_single_batch_convolution(v: OpView) -> str | None:
    """The MAC array runs 2-D convolutions of one image; a transposed one must not be grouped."""
    if v.kind != "conv":
        return None
    rank = v.rank(v.op.inputs[0])
    if rank != 4:
        return f"only 2-D convolutions run on the NPU (this one is {rank - 2}-D)"
    if v.op.attrs.transpose and v.op.attrs.group != 1:
        return "grouped ConvTranspose"
    if v.shapes[v.op.inputs[0]][0] != 1:
        return "convolutions with batch > 1"
    return None


@_npu
def matmul_of_a_tensor(v: OpView) -> str | None:
    """A MatMul's activation operand must have at least one dimension."""
    return "MatMul of a scalar" if v.kind == "matmul" and v.rank(v.op.inputs[0]) < 1 else None


@_npu
def spatial_resize(v: OpView) -> str | None:
    """Resize scales height and width of an N x C x H x W tensor."""
    if v.kind != "resize_nearest":
        return None
    src, dst = v.shapes[v.op.inputs[0]], v.shapes[v.op.outputs[0]]
    return "Resize that changes batch or channels" if len(src) != 4 or src[:2] != dst[:2] else None


@_npu
def four_d_pooling(v: OpView) -> str | None:
    """Pooling runs on N x C x H x W tensors."""
    if v.kind in ("global_avgpool", "avgpool") and v.rank(v.op.inputs[0]) != 4:
        return f"{v.kind} on a tensor that is not N x C x H x W"
    return None


@_npu
def dma_movement(v: OpView) -> str | None:
    """Data movement runs on the DMA engines: views (Reshape and kin), Transpose, Slice with
    positive steps, Split, and MaxPool of N x C x H x W tensors."""
    if v.kind != "move":
        return None
    op_type = v.op.op_type
    if op_type not in MOVES:
        return f"{op_type} is not a data movement the DMA engines do"
    if op_type == "MaxPool" and v.rank(v.op.inputs[0]) != 4:
        return "MaxPool on a tensor that is not N x C x H x W"
    if op_type == "Slice" and any(int(s) <= 0 for s in slice_steps(v.op, v.arrays)):
        return "Slice with a non-positive step"
    return None


@_npu
def fits_sram(v: OpView) -> str | None:
    """The code generator must find a tiling of the op that fits the target's SRAM."""
    if v.fits is not None and not v.fits(v.op):
        return f"does not fit {v.target.name}'s {v.target.sram_kib} KiB SRAM even in the smallest tile"
    return None


def npu_blocker(view: OpView) -> str | None:
    """None if the op can run on the target's NPU, else why not."""
    for constraint in NPU:
        reason = constraint(view)
        if reason:
            return reason
    return None


def slice_steps(op: MoveOp, arrays: dict) -> list:
    inputs, consts = op.inputs, op.constants
    if len(inputs) > 4 and inputs[4] in consts:
        return [int(v) for v in arrays[consts[inputs[4]]]]
    return [1]
