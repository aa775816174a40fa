"""The hardware description of a virtual-NPU target, and the built-in targets addressable by name."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, PositiveInt, model_validator


class TargetSpec(BaseModel):
    """What partition, codegen and the simulator need to know about one NPU."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    # Upper bounds well past any real NPU: a spec also arrives in untrusted .npub files and BUILD
    # files, and the simulator allocates what it says.
    clock_mhz: float = Field(gt=0, le=100_000)
    mac_rows: PositiveInt = Field(le=4096)
    mac_cols: PositiveInt = Field(le=4096)
    int16_rate: float = Field(0.25, gt=0, le=1, description="int16 MAC throughput relative to int8")
    vector_lanes: PositiveInt = Field(le=65536)
    sram_kib: PositiveInt = Field(le=256 * 1024)
    sram_banks: PositiveInt = Field(le=1024)
    accumulator_kib: PositiveInt = Field(le=256 * 1024)
    dram_bytes_per_cycle: float = Field(gt=0, le=1 << 20)
    dram_latency_cycles: int = Field(ge=0, le=1 << 20)
    sram_bytes_per_cycle: float = Field(
        64.0, gt=0, le=1 << 20, description="on-chip copy bandwidth (resident tensors)"
    )
    alignment_bytes: PositiveInt = Field(16, le=4096)
    # the host CPU that runs the CPU subgraphs (targets/cpu_cost.py): throughput and hand-over cost
    cpu_gmacs: float = Field(4.0, gt=0, le=1e6, description="CPU multiply-accumulates per ns")
    cpu_gelements: float = Field(1.0, gt=0, le=1e6, description="CPU elements read or written per ns")
    transition_us: float = Field(20.0, ge=0, le=1e6, description="cost of one NPU/CPU hand-over")
    activation_dtypes: tuple[Literal["int8", "int16"], ...] = ("int8", "int16")
    supported_ops: tuple[str, ...] = ()
    # how the MAC array can take a convolution (docs/npu.md, "Mappings"); every array has channels
    conv_mappings: tuple[Literal["channels", "depthwise", "spatial"], ...] = ("channels",)
    # whether a column's adder chain can be cut into bands of rows, each summing another output
    # position into its own accumulator, where a sum fits the rows twice or more (docs/npu.md)
    row_bands: bool = False
    # whether global and window pools and multiplies of a map by one value per channel (a
    # squeeze-excite gate, an unfolded batch norm) run on the MAC array's depthwise path instead
    # of the vector unit (docs/npu.md, "Channel-wise ops on the array"); only where the target
    # offers the depthwise mapping, whose per-column input path they use
    channelwise_on_array: bool = False

    @model_validator(mode="after")
    def _banks_divide_sram(self) -> TargetSpec:
        if self.sram_kib % self.sram_banks:
            raise ValueError(
                f"sram_kib ({self.sram_kib}) must be a multiple of sram_banks ({self.sram_banks})"
            )
        if "channels" not in self.conv_mappings:
            raise ValueError("conv_mappings must include 'channels' (the mapping every convolution has)")
        return self


def target_digest(target: TargetSpec) -> bytes:
    """SHA-256 of the target description, as a .npub header records it."""
    import hashlib
    import json

    canonical = TargetSpec.model_validate(json.loads(json.dumps(target.model_dump())))  # as a reader sees it
    return hashlib.sha256(json.dumps(canonical.model_dump(), sort_keys=True).encode()).digest()


_COMMON_OPS = (
    "Conv",
    "ConvTranspose",
    "Gemm",
    "MatMul",
    "Add",
    "Sub",
    "Mul",
    "Concat",
    "Split",
    "Slice",
    "MaxPool",
    "AveragePool",
    "GlobalAveragePool",
    "Relu",
    "Clip",
    "Sigmoid",
    "HardSigmoid",
    "HardSwish",
    "SiLU",
    "Tanh",
    # the vector unit's lookup tables: any function of one tensor
    *("GELU", "Gelu", "Erf", "Exp", "Log", "Sqrt", "Reciprocal", "Pow", "Softplus", "Softsign"),
    *("Elu", "Selu", "Celu", "LeakyRelu", "ThresholdedRelu", "Mish", "Abs", "Neg", "Sin", "Cos"),
    "Atan",
    # row reductions over the last axis
    "Softmax",
    "LayerNormalization",
    "Reshape",
    "Transpose",
    "Flatten",
)

BUILTIN_TARGETS: dict[str, TargetSpec] = {
    "vnpu-s": TargetSpec(
        name="vnpu-s",
        clock_mhz=500,
        mac_rows=16,
        mac_cols=16,
        vector_lanes=16,
        sram_kib=256,
        sram_banks=4,
        accumulator_kib=16,
        dram_bytes_per_cycle=8,
        dram_latency_cycles=100,
        cpu_gmacs=2.0,
        cpu_gelements=0.5,
        transition_us=30.0,
        # nearest Resize is a data move (Ethos-U55 upscales by addressing); a transposed
        # convolution needs the MAC array to skip inserted zeros, which the small array does not
        supported_ops=tuple(op for op in _COMMON_OPS if op != "ConvTranspose") + ("Resize",),
    ),
    "vnpu-m": TargetSpec(
        name="vnpu-m",
        # vnpu-s keeps the channels mapping only for now: with the others the precision search's
        # price list disagrees with codegen by 5.6% on one PP-OCR cls table there (issue 16 asks
        # for 5%; tests/test_search_prices.py); on vnpu-m it agrees within 5%
        conv_mappings=("channels", "depthwise", "spatial"),
        row_bands=True,
        channelwise_on_array=True,
        clock_mhz=1000,
        mac_rows=32,
        mac_cols=32,
        vector_lanes=64,
        sram_kib=2048,
        sram_banks=8,
        accumulator_kib=64,
        dram_bytes_per_cycle=32,
        dram_latency_cycles=150,
        cpu_gmacs=8.0,
        cpu_gelements=2.0,
        transition_us=15.0,
        supported_ops=_COMMON_OPS + ("Resize",),
    ),
}
