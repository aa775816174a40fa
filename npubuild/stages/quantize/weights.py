"""Weights and constants on the integer grid: symmetric int8 weights per output channel (or per
tensor), bias correction of the error they bring, constant operands on a grid of their own.
Shared by the encoder and the precision probe, which must quantize exactly alike."""

from __future__ import annotations

import numpy as np

from npubuild.intmodel.codes import qrange
from npubuild.stages.quantize import ranges
from npubuild.stages.quantize.planning import TensorParams
from npubuild.stages.reductions import vector_matrix


def quantize_weight(weight: np.ndarray, axis: int, per_channel: bool) -> tuple[np.ndarray, np.ndarray]:
    """int8 codes in [-127, 127] and the scale of each slice along `axis` (one scale repeated
    when not `per_channel`)."""
    w = weight.astype(np.float64)
    if per_channel:
        reduce = tuple(i for i in range(w.ndim) if i != axis)
        absmax = np.max(np.abs(w), axis=reduce)
    else:
        absmax = np.full(w.shape[axis], np.max(np.abs(w)))
    scale = np.where(absmax > 0, absmax / 127.0, 1.0)
    shape = [1] * w.ndim
    shape[axis] = -1
    q = np.clip(np.rint(w / scale.reshape(shape)), -127, 127).astype(np.int8)
    return q, scale


def grouped_transpose_scales(w: np.ndarray, group: int) -> tuple[np.ndarray, np.ndarray]:
    """A grouped ConvTranspose's weight [Cin, Cout/g, k...]: one scale per output channel of
    every group."""
    cin, cout_g = w.shape[0], w.shape[1]
    per = w.reshape(group, cin // group, cout_g, *w.shape[2:])
    absmax = np.max(np.abs(per), axis=tuple(i for i in range(per.ndim) if i not in (0, 2))).reshape(-1)
    scale = np.where(absmax > 0, absmax / 127.0, 1.0)
    q = np.clip(np.rint(per / scale.reshape(group, 1, cout_g, *([1] * (w.ndim - 2)))), -127, 127)
    return q.reshape(w.shape).astype(np.int8), scale


def output_mean_shift(mean, w: np.ndarray, group: int = 1, transpose: bool = False, strides=()) -> np.ndarray:
    """How far each output channel's mean moves when the input's per-channel means move by
    `mean`, through weights `w` in ONNX layout: [K, N] (MatMul, Gemm with B untransposed),
    [Cout, Cin/group, k...] (Conv), [Cin, Cout/group, k...] (ConvTranspose). Borders ignored.
    Each Conv output sums every tap over its receptive field; a ConvTranspose's input position
    adds its taps to prod(strides) output positions' worth of area, so there the output mean is
    the taps' sum over the input means divided by the stride's area. Sums in a fixed order
    (`reductions`): the result becomes a stored bias."""
    mean = np.asarray(mean, np.float64)
    w = np.asarray(w, np.float64)
    if w.ndim == 2:
        return vector_matrix(mean, w)
    if transpose:
        cin, cout_g = w.shape[0], w.shape[1]
        taps = w.reshape(group, cin // group, cout_g, -1).sum(axis=3)  # [group, in/group, out/group]
        shift = (taps * mean.reshape(group, cin // group, 1)).sum(axis=1).reshape(-1)
        return shift / float(np.prod(strides))
    cout, cin_g = w.shape[0], w.shape[1]
    per_input = w.reshape(cout, cin_g, -1).sum(axis=2)  # [Cout, Cin/g]
    # each output channel's group's input means, [Cout, Cin/g]; the products summed along the
    # last axis, the same reduction per channel as one channel at a time (the same bits)
    means = mean.reshape(group, cin_g)[np.arange(cout) // (cout // group)]
    return (per_input * means).sum(axis=1)


def bias_correction(mean, w, wq, wscale, bias, group: int, transpose: bool, strides=()) -> np.ndarray:
    """The bias minus the mean error the quantized weights add, given the input's per-channel
    calibration mean (None: no correction). `wscale` is per output channel: axis 0 of a Conv's
    weight, axis 1 of a ConvTranspose's ([Cin, Cout/group, k...], the scales of every group in
    turn) and of a MatMul's [K, N]."""
    if mean is None:
        return bias
    if w.ndim == 2:
        dequantized = wq.astype(np.float64) * wscale.reshape(1, -1)
    elif transpose:
        cin, cout_g = w.shape[0], w.shape[1]
        per = wq.astype(np.float64).reshape(group, cin // group, cout_g, -1)
        dequantized = (per * wscale.reshape(group, 1, cout_g, 1)).reshape(w.shape)
    else:
        dequantized = wq.astype(np.float64) * wscale.reshape([-1] + [1] * (w.ndim - 1))
    return bias - output_mean_shift(mean, dequantized - w, group, transpose, strides)


def constant_params(value: np.ndarray, bits: int) -> tuple[TensorParams, np.ndarray]:
    """A constant operand on an asymmetric grid spanning its own range, and its codes."""
    lo, hi = float(value.min()), float(value.max())
    scale, zp = ranges.quant_params(lo, hi, bits, symmetric=False)
    qmin, qmax = qrange(bits)
    q = np.clip(np.rint(value / scale) + zp, qmin, qmax).astype(np.int32)
    return TensorParams(scale, zp, bits), q


def bias_limit(input_bits: int) -> int:
    """The largest bias magnitude a MAC layer stores: int32 for int8 inputs; int64 for int16
    (TFLite's 16x8 scheme: in_scale * w_scale is ~256x finer and would overflow int32), held to
    48 bits."""
    return 2**31 - 1 if input_bits == 8 else 2**47
