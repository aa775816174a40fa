"""The integer model as typed data: the program quantize writes (`quantized.npq`'s header) and
everything after it reads (the golden interpreter, partition, the back end, the QDQ export).

One model per op kind, told apart by `kind`; each carries the attributes its integer semantics
need (docs/quantization.md) and names its integer arrays (weights, biases, multipliers, tables)
in the archive. `parse` validates an untrusted header into an `IntegerModel`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from npubuild.errors import UserError


class _Typed(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TensorQuant(_Typed):
    """A tensor's integer grid: real = (code - zero_point) * scale, codes of `bits` bits; with
    `channel_shifts`, one grid per channel (axis 1): real = code * scale * 2^channel_shifts[c]
    (int8 codes, zero point 0; a depthwise convolution's input made by a table)."""

    scale: float = Field(gt=0, allow_inf_nan=False)
    zero_point: int = Field(ge=-(2**15), le=2**16)
    bits: Literal[8, 16]
    channel_shifts: tuple[Annotated[int, Field(ge=0, le=15)], ...] = ()

    @model_validator(mode="after")
    def _one_grid_per_channel(self) -> TensorQuant:
        if self.channel_shifts and (self.bits != 8 or self.zero_point != 0):
            raise ValueError("per-channel grids are int8 with zero point 0")
        return self

    @property
    def computed_bits(self) -> int:
        """The width the op that makes the tensor computes its codes at: for a per-channel grid,
        16 bits on the base grid, which the per-channel shift then narrows to int8."""
        return 16 if self.channel_shifts else self.bits

    def channel_scales(self, ndim: int):
        """The scale, or with channel_shifts each channel's, shaped to broadcast over axis 1 of
        an `ndim`-dimensional tensor."""
        scales = grid_scales(self.scale, self.channel_shifts)
        return scales.reshape((1, -1) + (1,) * (ndim - 2)) if self.channel_shifts else scales


def grid_scales(scale: float, channel_shifts: tuple[int, ...]):
    """A grid's scales as float64: one per channel, scale x 2^shift, for a per-channel grid; else
    the one scale (0-d). (numpy is imported here, not with the module: the no-op build path
    parses no integer model.)"""
    import numpy as np

    if not channel_shifts:
        return np.float64(scale)
    return scale * np.exp2(np.asarray(channel_shifts, np.float64))


class _Op(_Typed):
    kind: str
    node: str = ""  # the ONNX node it came from
    op_type: str = ""
    inputs: list[str]
    outputs: list[str]
    constants: dict[str, str] = {}  # constant input -> its array in the archive

    @property
    def label(self) -> str:
        return self.node or self.outputs[0]

    @property
    def data_inputs(self) -> list[str]:
        """The inputs other ops or the network make (not its constants), in input order."""
        return [n for n in self.inputs if n and n not in self.constants]

    def operand_arrays(self, arrays: dict) -> list:
        """The arrays of the inputs after the first, None where one is not a constant: a Slice's
        starts, ends, axes and steps, a Reshape's shape, an Unsqueeze's axes."""
        return [arrays[self.constants[n]] if n in self.constants else None for n in self.inputs[1:]]


class QuantizeOp(_Op):
    """A float tensor (a network input, a float op's output) to codes on its grid."""

    kind: Literal["quantize"]


class FloatOp(_Op):
    """An ONNX node run in float (its serialized NodeProto is the array `proto`)."""

    kind: Literal["float"]
    proto: str


class MacArrays(_Typed):
    weight: str
    bias: str
    m0: str
    shift: str
    weight_scale: str


class MacAttrs(_Typed):
    min: int  # the clamp of the output codes (a fused Relu/Clip narrows it)
    max: int


class ConvGeometry(_Typed):
    """Where a convolution's windows fall (ONNX Conv / ConvTranspose attributes)."""

    strides: list[int]
    pads: list[int]
    dilations: list[int]
    group: int = Field(ge=1)
    transpose: bool = False
    output_padding: list[int] = []
    auto_pad: str = "NOTSET"


class ConvAttrs(ConvGeometry):
    min: int
    max: int


class ConvOp(_Op):
    kind: Literal["conv"]
    attrs: ConvAttrs
    arrays: MacArrays
    activation: str | None = None


class MatMulOp(_Op):
    kind: Literal["matmul"]
    attrs: MacAttrs
    arrays: MacArrays
    activation: str | None = None


class AddAttrs(_Typed):
    ma: int
    mb: int
    za: int
    zb: int


class AddOp(_Op):
    kind: Literal["add"]
    attrs: AddAttrs
    operand_params: list[TensorQuant] = []


class MulAttrs(_Typed):
    m0: int
    shift: int
    za: int
    zb: int


class MulOp(_Op):
    kind: Literal["mul"]
    attrs: MulAttrs
    operand_params: list[TensorQuant] = []


class Rescale(_Typed):
    """How one Concat input reaches the output's grid (`same`: it is already on it)."""

    m0: int
    shift: int
    zin: int
    same: bool


class BatchMatMulOp(_Op):
    """MatMul of two activations (attention's Q K^T and P V): sum of (a - za) (b - zb) over the
    inner axis, requantized by one multiplier; batch axes broadcast as in numpy."""

    kind: Literal["batch_matmul"]
    attrs: MulAttrs
    operand_params: list[TensorQuant] = []


class ConcatAttrs(_Typed):
    axis: int
    rescale: list[Rescale]


class ConcatOp(_Op):
    kind: Literal["concat"]
    attrs: ConcatAttrs
    operand_params: list[TensorQuant] = []


class LutAttrs(_Typed):
    offset: int  # table index of code 0, before the shift
    # the table has an entry per 2^index_shift neighbouring codes: entry (code + offset) >> shift
    index_shift: int = Field(0, ge=0, le=8)


class LutArrays(_Typed):
    table: str


class LutOp(_Op):
    kind: Literal["lut"]
    attrs: LutAttrs
    arrays: LutArrays


class SoftmaxAttrs(_Typed):
    rshift: int = Field(ge=0, le=16)  # the exponent table is indexed by d >> rshift


class SoftmaxOp(_Op):
    """Softmax along the last axis (rowwise.py); the output grid is fixed by its width."""

    kind: Literal["softmax"]
    attrs: SoftmaxAttrs
    arrays: LutArrays


class LayerNormAttrs(_Typed):
    eps_codes: int = Field(ge=1, le=2**46)  # n^2 epsilon in squared input codes


class LayerNormArrays(_Typed):
    params: str  # int64 [n, 3]: m0 (signed), shift, bias in output codes


class LayerNormOp(_Op):
    """LayerNormalization along the last axis with constant scale and bias (rowwise.py)."""

    kind: Literal["layernorm"]
    attrs: LayerNormAttrs
    arrays: LayerNormArrays


class ClampAttrs(_Typed):
    min: int
    max: int


class ClampOp(_Op):
    kind: Literal["clamp"]
    attrs: ClampAttrs


class PoolAttrs(_Typed):
    kernel_shape: list[int]
    strides: list[int] | None = None
    pads: list[int] | None = None
    dilations: list[int] | None = None
    ceil_mode: int = 0
    count_include_pad: int = 0


class PoolArrays(_Typed):
    m0: str
    shift: str


class AvgPoolOp(_Op):
    kind: Literal["avgpool"]
    attrs: PoolAttrs
    arrays: PoolArrays


class GlobalAvgPoolAttrs(_Typed):
    m0: int
    shift: int


class GlobalAvgPoolOp(_Op):
    kind: Literal["global_avgpool"]
    attrs: GlobalAvgPoolAttrs


class ResizeAttrs(_Typed):
    out_shape: list[int]
    coordinate_transformation_mode: str = "half_pixel"
    nearest_mode: str = "round_prefer_floor"


class ResizeOp(_Op):
    kind: Literal["resize_nearest"]
    attrs: ResizeAttrs


class MoveOp(_Op):
    """An op that moves codes without changing them (Reshape, Transpose, Slice, Split, MaxPool,
    ...): its ONNX attributes as they were."""

    kind: Literal["move"]
    attrs: dict[str, Any] = {}


Op = Annotated[
    QuantizeOp
    | FloatOp
    | ConvOp
    | MatMulOp
    | AddOp
    | MulOp
    | BatchMatMulOp
    | ConcatOp
    | LutOp
    | SoftmaxOp
    | LayerNormOp
    | ClampOp
    | AvgPoolOp
    | GlobalAvgPoolOp
    | ResizeOp
    | MoveOp,
    Field(discriminator="kind"),
]


def is_maxpool(op: Op) -> bool:
    """A MaxPool: an op that moves codes (`MoveOp`), with a window of its own."""
    return op.kind == "move" and op.op_type == "MaxPool"


def maxpool_attrs(op: MoveOp) -> PoolAttrs:
    """A MaxPool's window from its ONNX attributes (strides and dilations default to 1)."""
    at = op.attrs
    kernel = list(at["kernel_shape"])
    return PoolAttrs(
        kernel_shape=kernel,
        strides=at.get("strides") or [1] * len(kernel),
        pads=at.get("pads"),
        dilations=at.get("dilations") or [1] * len(kernel),
        ceil_mode=at.get("ceil_mode", 0),
    )


class FloatNode(_Typed):
    node: str
    op_type: str
    reason: str


class IntegerModel(_Typed):
    version: Literal[1] = 1
    inputs: list[str] = []
    outputs: list[str]
    ops: list[Op]
    tensors: dict[str, TensorQuant]
    float_nodes: list[FloatNode] = []
    opset: int = 13
    functions: list[str] = []  # arrays holding the model's serialized FunctionProtos
    # network inputs that arrive as uint8 pixels (fuse_preprocess): codes = pixel - 128 on the grid
    # scale 1, zero point -128, with no quantize op
    pixel_inputs: list[str] = []

    def readers(self) -> dict[str, list[int]]:
        """Each tensor's readers: the indices of the ops that take it as an input, in order (an op
        that takes it twice, twice)."""
        readers: dict[str, list[int]] = {}
        for i, op in enumerate(self.ops):
            for n in op.inputs:
                readers.setdefault(n, []).append(i)
        return readers

    def fine_preactivations(self) -> set[str]:
        """The 16-bit results whose table reads their top bits (the quantizer's
        `preactivation_bits`): part of an int8 model, never stored on the NPU when a convolution
        makes them."""
        return {op.inputs[0] for op in self.ops if op.kind == "lut" and op.attrs.index_shift}

    def result_tail(self) -> set[str]:
        """The tensors the network outputs are computed from by element-wise ops, moves,
        concatenations and a Softmax, back to the results of the ops before them (the
        quantizer's `output_bits`)."""
        producers = {o: op for op in self.ops for o in op.outputs}

        def follow(name: str) -> list[str] | None:
            op = producers.get(name)
            if op is None:
                return None
            if op.kind in ("add", "mul", "concat", "move", "softmax"):
                return [i for i in op.inputs if i in self.tensors]
            return []

        return walk_back(self.outputs, follow)


def walk_back(outputs: Iterable[str], follow: Callable[[str], list[str] | None]) -> set[str]:
    """The tensors reached from `outputs` back through their producers: `follow(name)` gives the
    inputs to walk on from `name` ([] to stop after it), or None to leave `name` out. The result
    tails of the plan (planning.py) and of the integer model walk this way."""
    reached, todo = set(), list(outputs)
    while todo:
        name = todo.pop()
        if name in reached:
            continue
        inputs = follow(name)
        if inputs is None:
            continue
        reached.add(name)
        todo.extend(inputs)
    return reached


def parse(meta: Any, where: str) -> IntegerModel:
    """The integer model in a header; a UserError naming the first problem when it is not one."""
    try:
        return IntegerModel.model_validate(meta)
    except ValidationError as exc:
        first = exc.errors()[0]
        at = ".".join(str(p) for p in first["loc"])
        raise UserError(f"{where}: not an integer model ({at}: {first['msg']})") from None
