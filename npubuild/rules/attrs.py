"""Attribute schemas of every rule; pydantic validates each call, an unknown attribute is an error."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, PositiveInt, field_validator, model_validator

from npubuild.cache.digest import SHA256_HEX


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


_PEP508_NAME = re.compile(r"^([A-Za-z0-9]|[A-Za-z0-9][A-Za-z0-9._-]*[A-Za-z0-9])$")
_PEP440_VERSION = re.compile(
    r"^([0-9]+!)?[0-9]+(\.[0-9]+)*((a|b|rc)[0-9]+)?(\.post[0-9]+)?(\.dev[0-9]+)?(\+[A-Za-z0-9]+(\.[A-Za-z0-9]+)*)?$"
)


class PypiFile(Strict):
    """A file inside a wheel on PyPI, pinned by the sha256 of the file itself."""

    package: str = Field(min_length=1, max_length=100)
    version: str = Field(min_length=1, max_length=64)
    path: str = Field(min_length=1, max_length=1000)
    sha256: str

    @field_validator("package")
    @classmethod
    def _pep508_name(cls, v: str) -> str:
        if not _PEP508_NAME.match(v):
            raise ValueError("must be a PyPI project name (letters, digits, '.', '_', '-'; PEP 508)")
        return v

    @field_validator("version")
    @classmethod
    def _exact_version(cls, v: str) -> str:
        if not _PEP440_VERSION.match(v):
            raise ValueError("must be one exact release such as '1.4.4' (PEP 440)")
        return v

    @field_validator("path")
    @classmethod
    def _member_path(cls, v: str) -> str:
        if v.startswith("/") or ".." in v.split("/") or "\\" in v:
            raise ValueError("must be a relative path inside the wheel")
        return v

    @field_validator("sha256")
    @classmethod
    def _hex_digest(cls, v: str) -> str:
        if not SHA256_HEX.match(v):
            raise ValueError("must be 64 lowercase hex digits")
        return v


class OnnxModelAttrs(Strict):
    name: str
    src: str | PypiFile
    data: list[str] = Field(
        [], description="the model's external-data files (package-relative, in src's folder or below)"
    )
    input_shapes: dict[str, list[PositiveInt]] = {}
    opset: int = Field(13, ge=13, le=21, description="the least default-domain opset after import")


class Preprocess(Strict):
    resize: tuple[PositiveInt, PositiveInt] | None = Field(None, description="(height, width)")
    # How the photo becomes (height, width): "stretch" ignores its aspect; "short_side" scales its
    # short side to `short_side` and crops the centre (ImageNet classifiers: 256 then 224);
    # "letterbox" fits it inside and pads with `pad_value` (YOLO: centred, 114; PP-OCR rec: top_left)
    resize_mode: Literal["stretch", "short_side", "letterbox"] = "stretch"
    short_side: PositiveInt | None = Field(None, description="default: the larger of resize / 0.875")
    pad_value: int = Field(114, ge=0, le=255, description="a pixel value, before scale/mean/std")
    pad_align: Literal["center", "top_left"] = "center"
    layout: Literal["NCHW", "NHWC"] = "NCHW"
    color: Literal["RGB", "BGR", "GRAY"] = "RGB"
    scale: float = 1 / 255
    mean: list[float] = [0.0, 0.0, 0.0]
    std: list[float] = [1.0, 1.0, 1.0]
    # int32/int64 are for tensor files (token ids); images are pixels, never integers that wide.
    dtype: Literal["float32", "float16", "uint8", "int8", "int32", "int64"] = "float32"

    @model_validator(mode="after")
    def _channels(self) -> Preprocess:
        if self.resize_mode != "stretch" and self.resize is None:
            raise ValueError(f"resize_mode {self.resize_mode} needs resize = [height, width]")
        channels = 1 if self.color == "GRAY" else 3
        for field in ("mean", "std"):
            if len(getattr(self, field)) not in (1, channels):
                raise ValueError(f"{field} needs 1 or {channels} values for color {self.color}")
        if any(s == 0 for s in self.std):
            raise ValueError("std must not contain 0")
        return self

    def value_range(self) -> tuple[float, float] | None:
        """Every value this preprocessing can give a photo's 8-bit pixels, over all channels; None
        for raw-pixel dtypes. The network input's grid spans it, because calibration photos rarely
        reach black and white in every channel and a photo that does would be clipped."""
        if self.dtype not in ("float32", "float16"):
            return None
        channels = max(len(self.mean), len(self.std))  # each is 1 or the channel count
        means = self.mean * (channels // len(self.mean))
        stds = self.std * (channels // len(self.std))
        ends = [(pixel * self.scale - m) / s for pixel in (0, 255) for m, s in zip(means, stds)]
        return min(ends), max(ends)

    def pixels(self) -> Preprocess:
        """The same photo as a model with this preprocessing fused in takes it: pixel values 0..255
        as decoded (RGB or GRAY), resized alike, NCHW, no scale, mean or std."""
        color = "GRAY" if self.color == "GRAY" else "RGB"
        return self.model_copy(
            update={"color": color, "scale": 1.0, "mean": [0.0], "std": [1.0], "layout": "NCHW"}
        )


class DatasetAttrs(Strict):
    name: str
    srcs: list[str]
    preprocess: Preprocess = Preprocess()
    limit: PositiveInt | None = None


class OptimizeConfig(Strict):
    disable: list[str] = []
    max_iterations: PositiveInt = 8
    check_samples: PositiveInt = 4
    check_rtol: float = Field(1e-3, ge=0)
    check_atol: float = Field(1e-4, ge=0)


class QuantizeConfig(Strict):
    method: Literal["minmax", "percentile", "kl", "mse"] = "mse"
    percentile: float = Field(99.99, gt=50, le=100)
    # the error `mse` minimises over the calibration samples: "pooled", the squared error of
    # every value, where the samples with the largest values decide; "relative", each sample's
    # squared error over its own power, summed, so a faint image weighs as much as a bright one;
    # "spread", relative for the tensors whose samples' powers spread over more than
    # `spread_decades` (10th to 90th percentile sample), pooled for the others
    # (docs/quantization.md, "Every image weighs the same": chosen on the validation split)
    range_error: Literal["pooled", "relative", "spread"] = "spread"
    spread_decades: float = Field(0.3, ge=0)
    weight_bits: Literal[8] = 8
    activation_bits: Literal[8, 16] = 8
    per_channel: bool = True
    symmetric_activations: bool = False
    bias_correction: bool = True
    # cross-layer equalization: a convolution's output channels scaled down and its readers'
    # input channels up where only ReLU-like activations lie between, so the two layers' ranges
    # match (Nagel et al. 2019). A float rewrite, so optimize runs it and every later stage reads
    # the equalized model (docs/quantization.md, "Cross-layer equalization and SmoothQuant")
    equalize: bool = False
    # SmoothQuant's migration strength alpha (Xiao et al. 2023), or None for off: a LayerNorm's
    # output channels divided by max|X_j|^alpha / max|W_j|^(1 - alpha), measured on calibration
    # samples, and the MatMul weight rows that read them multiplied by it. A float rewrite that
    # optimize runs, as equalize. 0.3 chosen on the validation split; it changes only models with
    # a LayerNorm (docs/quantization.md, "Cross-layer equalization and SmoothQuant")
    smooth: float | None = Field(0.3, ge=0, le=1)
    # the same migration, at smooth's alpha, between ReLU-joined convolutions (equalize's pairs,
    # by the measured activations instead of the first layer's weights): at alpha 0.5 +5.9 dB on
    # PP-OCRv4 rec's validation split, -5.7 on PP-OCR cls's, so not the default
    smooth_convolutions: bool = False
    # after the integer model is built, each MAC layer's bias absorbs the mean error of its
    # quantized input, measured on the calibration set by running the integer model op by op
    # (empirical bias correction; docs/quantization.md, "Empirical bias correction")
    empirical_bias: bool = True
    # how the int8 weights are rounded: to the nearest step, or GPTQ's error-compensating order
    # on the calibration inputs (docs/quantization.md, "Error-compensating weight rounding": it
    # lost on every validation model, so it is not the default)
    weight_rounding: Literal["nearest", "gptq"] = "nearest"
    # a square (Pow 2) and a sum of squares get this width (docs/quantization.md, "Squares")
    square_bits: Literal[8, 16] = 16
    # the width of a Softmax's grid: its output on the fixed grid of 1/256 (int8) or 1/32768
    # (int16), and its input where a float op makes it. Attention probabilities over n tokens are
    # about 1/n, a code or two of the int8 grid, and the attention-times-values MatMul sums them:
    # on the validation splits int16 gains ViT-S +3.3 and +4.0 dB and YOLOv8n's DFL +0.7, costs
    # PP-OCRv4 rec 0.1 dB, and adds 15% to ViT-S's estimated latency (docs/quantization.md,
    # "Softmax at 16 bits")
    softmax_bits: Literal[8, 16] = 16
    # A lookup-table activation that produces a network output (a final Sigmoid) runs in float:
    # probabilities quantized to 1/255 steps lose the small values detectors threshold on.
    float_output_activations: bool = True
    # the grid of a convolution's result that only a lookup-table activation (SiLU, HardSwish,
    # Sigmoid, ...) reads: 16 bits in the output path, the table indexed by its top 10 bits, so the
    # activation sees the accumulator far finer than int8 at no latency (docs/quantization.md)
    preactivation_bits: Literal[8, 16] = 16
    # the grid of a network output and of the element-wise tail that computes it from the last
    # MAC or table (a detector's box decoding and its concatenation of boxes and class scores,
    # whose ranges differ by 300x): what the user reads (docs/quantization.md, "Result grids")
    output_bits: Literal[8, 16] = 16
    # the grid of a depthwise convolution's input. One grid must hold every channel, and those of
    # a MobileNet-style expansion differ by 100x, so on one int8 grid most channels get a handful
    # of codes; and the convolution mixes nothing across channels, so each channel's rounding
    # passes on whole. "channel": an int8 grid per channel where a lookup-table activation makes
    # the tensor and that is finer than one grid (the table's 16-bit entries shifted per channel;
    # same cost as "tensor"), else one int8 grid; "channel_or_int16": the same, and one int16
    # grid where the grids per channel do not serve (the convolution at the int16 rate: a
    # depthwise convolution's MACs are few); "int16": one int16 grid for every depthwise input
    # (docs/quantization.md, "Per-channel depthwise inputs" and "Depthwise inputs the
    # per-channel grids do not serve")
    depthwise_inputs: Literal["channel_or_int16", "channel", "tensor", "int16"] = "channel_or_int16"
    # the grid of a table's result that only a per-code op after it reads (a scalar scale or
    # bias: PP-LCNet's learnable affine after each HardSwish): the table absorbs that op, so the
    # tensor is never stored and 16 bits cost nothing (docs/quantization.md)
    absorbed_bits: Literal[8, 16] = 16
    # "shared": the tensors a Concat joins take its grid, so each is written straight into its
    # place in the concatenation and the Concat moves nothing on the NPU (TFLite's and TPU-MLIR's
    # rule); "own": each keeps its own grid and the Concat requantizes (docs/quantization.md)
    concat_grids: Literal["shared", "own"] = "shared"
    # the QDQ model's form: "exact" computes the integer model's codes in onnxruntime (tables as
    # Gathers, adds and MAC output paths in int64); "standard" is DequantizeLinear -> op ->
    # QuantizeLinear everywhere, the pattern other runtimes fuse into their integer kernels
    qdq_export: Literal["exact", "standard"] = "exact"

    @model_validator(mode="after")
    def _smoothing_has_a_strength(self) -> QuantizeConfig:
        if self.smooth_convolutions and self.smooth is None:
            raise ValueError(
                "smooth_convolutions migrates at smooth's alpha; give 'smooth' (for example 0.5)"
            )
        return self


class LayerOverride(Strict):
    match: str | None = Field(None, description="glob over node names")
    op_type: str | None = None
    bits: Literal[8, 16] | None = None
    method: Literal["minmax", "percentile", "kl", "mse"] | None = None
    keep_float: bool = False

    @model_validator(mode="after")
    def _selects_something(self) -> LayerOverride:
        if self.match is None and self.op_type is None:
            raise ValueError("an override needs 'match' (node-name glob) or 'op_type'")
        return self


class AccuracyGoal(Strict):
    cosine: float | None = Field(None, gt=0, le=1)
    sqnr: float | None = None


class MixedPrecision(Strict):
    goal: AccuracyGoal
    candidates: list[Literal["int8", "int16", "float"]] = ["int8", "int16", "float"]
    enforce: bool = False
    # what "least cost" means: the target's estimated cycles, or the MACs taken off int8
    minimize: Literal["cycles", "non_int8_macs"] = "cycles"

    @model_validator(mode="after")
    def _usable(self) -> MixedPrecision:
        if self.goal.cosine is None and self.goal.sqnr is None:
            raise ValueError("the goal needs 'cosine' and/or 'sqnr'")
        if len(set(self.candidates)) < 2:
            raise ValueError("candidates need at least two precisions to choose from")
        return self


class Gates(Strict):
    min_cosine: float | None = Field(None, gt=0, le=1)
    min_sqnr: float | None = None
    min_top1: float | None = Field(None, ge=0, le=1)
    max_latency_ms: float | None = Field(None, gt=0)

    def declared(self) -> dict[str, float]:
        """The gates the BUILD file sets (a gate left out is not checked)."""
        return {k: v for k, v in self.model_dump().items() if v is not None}


class NpuModelAttrs(Strict):
    name: str
    model: str
    # may be left out for a pre-quantized (QDQ) model, which carries its own grids
    calibration: str | None = None
    evaluation: str | None = None
    target: str = "vnpu-m"
    optimize: OptimizeConfig = OptimizeConfig()
    quantize: QuantizeConfig = QuantizeConfig()
    overrides: list[LayerOverride] = []
    mixed_precision: MixedPrecision | None = None
    precision_table: str | None = Field(
        None, description="a hand-written precision table (JSON) of the package"
    )
    gates: Gates = Gates()
    # output name -> the axis its classes lie on, for top-1 agreement (default: a Softmax's axis
    # when the output is one, else 1)
    class_axes: dict[str, int] = {}
    # fold the photo data sets' preprocessing into the model: the NPU takes uint8 pixels
    fuse_preprocess: bool = False

    @model_validator(mode="after")
    def _one_precision_source(self) -> NpuModelAttrs:
        if self.mixed_precision is not None and self.precision_table is not None:
            raise ValueError("give either mixed_precision (a search) or precision_table (by hand), not both")
        if self.calibration is None and self.evaluation is None:
            raise ValueError("give a calibration set, or for a pre-quantized (QDQ) model an evaluation set")
        if self.fuse_preprocess and self.calibration is None:
            raise ValueError(
                "fuse_preprocess folds the calibration set's preprocessing: give a calibration set"
            )
        if self.calibration is None and self.mixed_precision is not None:
            raise ValueError("mixed_precision measures on calibration statistics: give a calibration set")
        return self


class NpuTargetAttrs(Strict):
    """A custom target derived from a built-in one; every other attribute overrides a spec field."""

    model_config = ConfigDict(extra="allow", frozen=True)
    name: str
    base: str = "vnpu-m"
