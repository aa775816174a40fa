"""The .npub metadata as pydantic models: a binary's JSON is validated before anything uses it."""

from __future__ import annotations

import math
from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeInt,
    PositiveInt,
    model_validator,
)

from npubuild.intmodel.program import TensorQuant
from npubuild.targets.spec import TargetSpec

MAX_ELEMENTS = 1 << 30  # of one tensor: the simulator and the runtime allocate what a shape says


def _bounded(shape: list[int]) -> list[int]:
    if len(shape) > 8 or math.prod(shape) > MAX_ELEMENTS:
        raise ValueError(f"shape {shape[:8]} is larger than {MAX_ELEMENTS} elements or 8 dimensions")
    return shape


Shape = Annotated[list[NonNegativeInt], AfterValidator(_bounded)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


# A tensor's grid: the integer model's own type (scale > 0 and finite, 8 or 16 bits).
Quant = TensorQuant


class InputSpec(_Strict):
    name: str
    shape: Shape
    # float32 inputs are quantized on the way in; integer ones (token ids) go as they are to the
    # CPU subgraph that reads them
    dtype: Literal["float32", "float16", "int8", "uint8", "int16", "int32", "int64", "bool"] = "float32"
    # uint8 camera pixels of a model with fused preprocessing: the input DMA flips each byte's
    # sign bit as it writes DRAM, so the NPU reads codes pixel - 128 (grid scale 1, zero point -128)
    pixels: bool = False

    @model_validator(mode="after")
    def _pixels_are_bytes(self) -> InputSpec:
        if self.pixels and self.dtype != "uint8":
            raise ValueError("a pixels input is uint8")
        return self


class OutputSpec(_Strict):
    name: str
    shape: Shape
    quant: Quant | None = None


class TensorSpec(Quant):
    shape: Shape
    dram: NonNegativeInt


class DramIo(_Strict):
    name: str
    dram: NonNegativeInt
    shape: Shape
    bits: Literal[8, 16]


class CpuInput(_Strict):
    name: str
    value: str
    state: Literal["f", "q"]
    # TensorProto FLOAT, INT8, INT16 (codes), an integer network input's type: UINT8, INT32,
    # INT64, BOOL, FLOAT16 (token ids, masks), or a value one CPU subgraph hands another in a type
    # the quantizer leaves alone: DOUBLE, UINT16, UINT32, UINT64 (float64 arithmetic, shapes)
    dtype: Literal[1, 2, 3, 4, 5, 6, 7, 9, 10, 11, 12, 13]


class CpuOutput(_Strict):
    name: str
    value: str
    state: Literal["f", "q"]


class NpuSubgraph(_Strict):
    device: Literal["npu"]
    code: tuple[NonNegativeInt, PositiveInt]
    inputs: list[DramIo]
    outputs: list[DramIo]
    ops: list[str]
    marks: list[tuple[NonNegativeInt, str, str]] = []
    estimate: dict = {}


class CpuSubgraph(_Strict):
    device: Literal["cpu"]
    model: tuple[NonNegativeInt, NonNegativeInt]
    inputs: list[CpuInput]
    outputs: list[CpuOutput]
    ops: list[str]


class Meta(_Strict):
    target: TargetSpec
    inputs: list[InputSpec]
    outputs: list[OutputSpec]
    tensors: dict[str, TensorSpec]
    dram_size: NonNegativeInt = Field(le=1 << 30)  # the simulator allocates it
    constants_base: NonNegativeInt
    subgraphs: list[Annotated[NpuSubgraph | CpuSubgraph, Field(discriminator="device")]]
