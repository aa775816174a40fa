"""Empirical bias correction: each MAC layer's bias absorbs the mean error its quantized input
carries, measured by running the integer model on calibration samples (Nagel et al. 2019,
"empirical bias correction"; NNCF's BiasCorrection).

The analytic correction (`weights.bias_correction`) removes the mean shift of the *weight*
rounding, given the float input's per-channel means. What it cannot see is a mean error in the
*input*: clipping, a zero point, a table's rounding leave each channel's mean a little off, with
the same sign at every position, and a convolution sums that over its whole receptive field, so
the bias compounds from layer to layer (PP-OCRv4 det: a third of the error energy in its middle
layers is per-channel mean, docs/quantization.md). Here the integer model runs op by op over the
samples; before a MAC layer runs, its input's per-channel mean (dequantized) is compared with the
float model's on the same samples, and the bias moves by what the difference adds to each output
channel, `sum_k w[c, k] * (mean_q - mean_f)[k]` (as the analytic correction, borders ignored).
Later layers see the corrected outputs: the correction is sequential, as the error is.

Each sample gives its own shift; their mean is shrunk channel by channel by how much the samples
disagree (`_shrunk_shift`), so a calibration set that mixes kinds of images (photographs and
pages of text) corrects only what holds across them. Chosen on the validation split
(docs/quantization.md): the plain mean lost 2.8 dB on one model there, the shrunk one at most 2.0.
"""

from __future__ import annotations

import numpy as np
import onnx

from npubuild.intmodel.codes import dequantize
from npubuild.intmodel.program import ConvOp, IntegerModel, MatMulOp, grid_scales
from npubuild.stages.feeds import float_values, spread_indices
from npubuild.stages.quantize.weights import bias_limit, output_mean_shift

# Samples the integer model runs on (evenly spaced through a larger calibration set): every one
# of them is alive at once, op by op, so this bounds the correction's memory.
MAX_SAMPLES = 64
# What the samples' live tensors may hold at once: every sample runs op by op side by side, so a
# large input (a 1024x1024 image) runs fewer of them rather than more memory.
MEMORY_BYTES = 2**30


def sample_indices(count: int, limit: int = MAX_SAMPLES) -> list[int]:
    """Which calibration samples the correction runs: all, or `limit` evenly spaced."""
    return spread_indices(count, limit)


def samples_within(sample_bytes: int, budget: int | None = None) -> int:
    """How many samples whose live tensors peak at `sample_bytes` each fit in `budget` (default
    MEMORY_BYTES; at least 1, at most MAX_SAMPLES)."""
    budget = MEMORY_BYTES if budget is None else budget
    return max(1, min(MAX_SAMPLES, budget // max(sample_bytes, 1)))


def _lifetimes(program: IntegerModel) -> tuple[dict[str, int], set[str]]:
    """Each tensor's last reader (op index) and the tensors kept to the end (the outputs)."""
    last_use = {}
    for i, op in enumerate(program.ops):
        for name in op.inputs:
            last_use[name] = i
    return last_use, set(program.outputs)


def _forget_dead(env: dict, op, index: int, last_use: dict[str, int], keep: set[str]) -> None:
    """What no op after `index` reads: gone, so memory stays a few tensors."""
    for name in op.inputs:
        if last_use.get(name) == index and name not in keep:
            env.pop(name, None)


def peak_live_bytes(program: IntegerModel, interpreter, feed: dict) -> int:
    """One sample's largest live set, in bytes, while the integer model runs op by op."""
    last_use, keep = _lifetimes(program)
    env = interpreter.start(feed)
    peak = sum(np.asarray(v).nbytes for v in env.values())
    for i, op in enumerate(program.ops):
        interpreter.step(op, env)
        peak = max(peak, sum(np.asarray(v).nbytes for v in env.values()))
        _forget_dead(env, op, i, last_use, keep)
    return peak


def _channel_axis(op) -> int:
    """A MAC input's channel axis: 1 for a convolution, the last for a MatMul."""
    return 1 if isinstance(op, ConvOp) else -1


def _channel_mean(value: np.ndarray, axis: int) -> np.ndarray:
    """One sample's per-channel mean over every other axis."""
    value = np.asarray(value, np.float64)
    axis = axis % value.ndim
    return value.mean(axis=tuple(i for i in range(value.ndim) if i != axis))


def float_means(model: onnx.ModelProto, macs: dict[str, int], feeds: list[dict]) -> dict[str, np.ndarray]:
    """The float model's per-channel mean of each MAC input named in `macs` (name -> channel
    axis), one row per feed ([samples, channels]), in onnxruntime."""
    names = sorted(macs)
    means: dict[str, list[np.ndarray]] = {name: [] for name in names}
    for values in float_values(model, names, feeds):
        for name in names:
            means[name].append(_channel_mean(values[name], macs[name]))
    return {name: np.stack(rows) for name, rows in means.items()}


def _output_shift(op, arrays: dict, difference: np.ndarray) -> np.ndarray:
    """Each output channel's mean shift (float) from its input's per-channel mean difference."""
    codes = arrays[op.arrays.weight]
    scale = arrays[op.arrays.weight_scale].astype(np.float64)
    if isinstance(op, MatMulOp):
        shift = output_mean_shift(difference, codes)
    else:
        shift = output_mean_shift(difference, codes, op.attrs.group, op.attrs.transpose, op.attrs.strides)
    # the weights' scales are per output channel: applied after the sum, as the accumulator does
    return shift * np.broadcast_to(scale, shift.shape)


def _shrunk_shift(op, arrays: dict, differences: np.ndarray) -> np.ndarray:
    """The mean of the samples' output shifts, each channel's shrunk by how uncertain it is
    (positive-part James-Stein: mean x max(0, 1 - se^2 / mean^2), se the standard error over the
    samples): a shift the samples disagree on (a calibration set of photographs and text pages)
    is not trusted to hold on the next image."""
    rows = [_output_shift(op, arrays, d) for d in differences]
    return shrunk_mean(np.stack(rows))


def shrunk_mean(shifts: np.ndarray) -> np.ndarray:
    """The mean over axis 0 (one row per sample), each column times max(0, 1 - se^2 / mean^2)."""
    mean = shifts.mean(axis=0)
    if len(shifts) < 2:
        return mean
    se2 = shifts.var(axis=0, ddof=1) / len(shifts)
    return mean * np.clip(1.0 - se2 / np.maximum(mean * mean, 1e-300), 0.0, 1.0)


def correctable(program: IntegerModel, float_names: set[str]) -> dict[str, int]:
    """The tensors whose float means the correction needs (name -> channel axis): each MAC
    layer's input and output, where they are integer tensors the float model also has."""
    wanted = {}
    for op in program.ops:
        if isinstance(op, (ConvOp, MatMulOp)) and op.inputs[0] in program.tensors:
            for name in (op.inputs[0], op.outputs[0]):
                if name in float_names:
                    wanted[name] = _channel_axis(op)
    return wanted


def _integer_means(op, name: str, envs: list[dict], program: IntegerModel) -> np.ndarray:
    """The integer model's per-channel means of a MAC layer's input or output (dequantized), one
    row per sample."""
    t = program.tensors[name]
    return np.stack([_channel_mean(dequantize(env[name], t), _channel_axis(op)) for env in envs])


def _mean_error(op, envs: list[dict], program: IntegerModel, means: dict) -> float:
    """The squared per-channel mean error of the layer's output against the float model's."""
    out = op.outputs[0]
    quantized = _integer_means(op, out, envs, program)
    return float(np.sum((quantized.mean(axis=0) - means[out].mean(axis=0)) ** 2))


def _corrected_bias(op, arrays: dict, t, shift: np.ndarray) -> np.ndarray:
    """The layer's int bias less `shift` (float, per output channel) in accumulator steps."""
    weight_scale = arrays[op.arrays.weight_scale].astype(np.float64)
    acc_scale = np.reshape(grid_scales(t.scale, t.channel_shifts), -1) * weight_scale
    bias = arrays[op.arrays.bias]
    limit = bias_limit(t.bits)
    return np.clip(bias.astype(np.float64) - np.rint(shift / acc_scale), -limit - 1, limit).astype(bias.dtype)


def correct_biases(
    program: IntegerModel, arrays: dict, interpreter, means: dict[str, np.ndarray], feeds: list[dict]
) -> tuple[dict[str, np.ndarray], dict]:
    """The bias arrays that moved (array name -> corrected int bias) and a summary. `means`: the
    float model's per-channel means (float_means of `correctable`), on the same `feeds`.
    `interpreter` runs `program` over `arrays`; the corrected biases are written into `arrays`.

    A correction is kept only where the layer's own output then has the smaller mean error: the
    shift is worked out for the layer's linear part, and through a Relu or a table after it, on
    a network whose error is large (Silero VAD, 0 to 3 dB), a shift can move the output's means
    away from the float ones; taken anyway, such shifts compounded to 557 in later layers."""
    last_use, keep = _lifetimes(program)
    envs = [interpreter.start(feed) for feed in feeds]
    moved: dict[str, np.ndarray] = {}
    largest, rejected = 0.0, 0

    def run(op) -> None:
        for env in envs:
            interpreter.step(op, env)

    for i, op in enumerate(program.ops):
        x = op.inputs[0] if op.inputs else ""
        ran = False
        if isinstance(op, (ConvOp, MatMulOp)) and x in means:
            shift = _shrunk_shift(op, arrays, _integer_means(op, x, envs, program) - means[x])
            bias = arrays[op.arrays.bias]
            corrected = _corrected_bias(op, arrays, program.tensors[x], shift)
            if not np.array_equal(corrected, bias):
                judged = op.outputs[0] in means
                if judged:
                    run(op)
                    error_before = _mean_error(op, envs, program, means)
                arrays[op.arrays.bias] = corrected
                interpreter.forget_rules()
                run(op)
                ran = True
                if judged and _mean_error(op, envs, program, means) >= error_before:
                    arrays[op.arrays.bias] = bias  # no better where it can be measured: as it was
                    interpreter.forget_rules()
                    run(op)
                    rejected += 1
                else:
                    moved[op.arrays.bias] = corrected
                    largest = max(largest, float(np.max(np.abs(shift))))
        if not ran:
            run(op)
        for env in envs:
            _forget_dead(env, op, i, last_use, keep)
    return moved, correction_summary(len(feeds), len(moved), rejected, largest)


def correction_summary(samples: int, layers: int, rejected: int, largest_shift: float) -> dict:
    """What quantize.json reports of the correction."""
    shift = round(largest_shift, 6)
    return {"samples": samples, "layers": layers, "rejected": rejected, "largest_shift": shift}
