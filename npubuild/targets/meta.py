"""The .npub metadata as pydantic models: a binary's JSON is validated before anything uses it."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, PositiveInt

from npubuild.targets.spec import TargetSpec


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Quant(_Strict):
    bits: Literal[8, 16]
    scale: float
    zero_point: int


class InputSpec(_Strict):
    name: str
    shape: list[NonNegativeInt]


class OutputSpec(_Strict):
    name: str
    shape: list[NonNegativeInt]
    quant: Quant | None = None


class TensorSpec(Quant):
    shape: list[NonNegativeInt]
    dram: NonNegativeInt


class DramIo(_Strict):
    name: str
    dram: NonNegativeInt
    shape: list[NonNegativeInt]
    bits: Literal[8, 16]


class CpuInput(_Strict):
    name: str
    value: str
    state: Literal["f", "q"]
    dtype: Literal[1, 3, 5]  # TensorProto FLOAT, INT8, INT16


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
