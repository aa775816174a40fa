"""Exact integer kernels shared by the golden interpreter and the NPU simulator: padding rules,
sliding windows, convolution accumulators (float64 sums of integer products, exact below 2^53),
average-pool divisors and nearest-neighbour indices, all with ONNX semantics."""

from __future__ import annotations

import math

import numpy as np

from npubuild.intmodel.ortconv import FLOAT32_EXACT, ExactConvs
from npubuild.intmodel.program import ConvGeometry, PoolAttrs, ResizeAttrs


def conv_pads(attrs: ConvGeometry, in_spatial, kernel) -> list[int]:
    auto = attrs.auto_pad
    if auto in ("NOTSET", "") or auto is None:
        return list(attrs.pads)
    if auto == "VALID":
        return [0] * (2 * len(kernel))
    begins, ends = [], []
    for size, k, s, d in zip(in_spatial, kernel, attrs.strides, attrs.dilations):
        out = math.ceil(size / s)
        total = max((out - 1) * s + (k - 1) * d + 1 - size, 0)
        small, large = total // 2, total - total // 2
        begins.append(small if auto == "SAME_UPPER" else large)
        ends.append(large if auto == "SAME_UPPER" else small)
    return begins + ends


def windows(xc: np.ndarray, kernel, strides, dilations, pads, pad_value: float) -> np.ndarray:
    """[N, C, *out, *kernel] views of the padded input."""
    nd = len(kernel)
    pad_width = [(0, 0), (0, 0)] + [(pads[i], pads[i + nd]) for i in range(nd)]
    xp = np.pad(xc, pad_width, constant_values=pad_value)
    span = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]
    view = np.lib.stride_tricks.sliding_window_view(xp, span, axis=tuple(range(2, 2 + nd)))
    index = (
        (slice(None), slice(None))
        + tuple(slice(None, None, s) for s in strides)
        + tuple(slice(None, None, d) for d in dilations)
    )
    return view[index]


def window_max(x: np.ndarray, kernel, strides, dilations, pads, pad_value) -> np.ndarray:
    """The max over each window (MaxPool), one spatial axis at a time: the max of a k x k window
    is the max over k rows of each row's max over k columns, 2k - 2 element-wise maxima instead
    of a reduction over k^2 taps (the same values: max is associative). Strided windows are the
    stride-1 result subsampled."""
    nd = len(kernel)
    if any(pads):
        pad_width = [(0, 0), (0, 0)] + [(pads[i], pads[i + nd]) for i in range(nd)]
        x = np.pad(x, pad_width, constant_values=pad_value)
    for axis, (k, d) in enumerate(zip(kernel, dilations)):
        size = x.shape[2 + axis] - (k - 1) * d
        if size <= 0:
            return windows(x, kernel, strides, dilations, [0] * 2 * nd, pad_value).max(
                axis=tuple(range(-nd, 0))
            )  # a window wider than the input: no output, as the views say

        taps = [x[(slice(None),) * (2 + axis) + (slice(t * d, t * d + size),)] for t in range(k)]
        widest = np.array(taps[0])
        for tap in taps[1:]:
            np.maximum(widest, tap, out=widest)
        x = widest
    return x[(slice(None), slice(None)) + tuple(slice(None, None, s) for s in strides)]


def exact_dtype(xc: np.ndarray, w: np.ndarray, terms: int):
    """The narrowest float type in which every partial sum of `terms` products x*w is exact
    (FLOAT32_EXACT: below 2^24 float32 sums integers exactly in any order, BLAS's blocking
    included, at twice float64's speed)."""
    bound = float(np.abs(xc).max(initial=0)) * float(np.abs(w).max(initial=0)) * terms
    return np.float32 if bound < FLOAT32_EXACT else np.float64


def conv_sums(
    xc: np.ndarray,
    w: np.ndarray,
    attrs: ConvGeometry,
    exact: ExactConvs | None = None,
    key: object = None,
    x_bound: float | None = None,
    named: object = None,
) -> tuple[np.ndarray, float | None]:
    """(sums, a bound on every |sum| where onnxruntime computed them, else None) of the exact
    integer convolution of zero-point-free inputs: onnxruntime's float32 Conv when every partial
    sum is exact there (`exact`, the caller's sessions; `named`, ExactConvs.sums's token for the
    weights), else sums of integer products in float32 or float64, whichever holds them exactly
    (exact_dtype), returned in that type.

    Each kernel tap is one strided slice of the padded input; a depthwise convolution multiplies
    and adds those slices, any other stacks them into columns [N, C/g * taps, out] for one GEMM
    per group (a 1x1 convolution without stride is a GEMM on the input itself)."""
    kernel = list(w.shape[2:])
    nd = len(kernel)
    pads = conv_pads(attrs, xc.shape[2:], kernel)
    exact32 = exact.sums(xc, w, attrs, pads, False, key, x_bound, named) if exact is not None else None
    if exact32 is not None:
        return exact32
    n, c = xc.shape[:2]
    cout, group = w.shape[0], attrs.group
    cg, og = c // group, cout // group
    taps = math.prod(kernel)
    dtype = exact_dtype(xc, w, cg * taps)
    x = xc.astype(dtype, copy=False)
    wf = w.astype(dtype)
    if any(pads):
        x = np.pad(x, [(0, 0), (0, 0)] + [(pads[i], pads[i + nd]) for i in range(nd)])
    out_sp = [
        (x.shape[2 + i] - (kernel[i] - 1) * attrs.dilations[i] - 1) // attrs.strides[i] + 1 for i in range(nd)
    ]

    def tap_slice(tap) -> tuple:
        return (slice(None), slice(None)) + tuple(
            slice(t * d, t * d + (o - 1) * s + 1, s)
            for t, d, o, s in zip(tap, attrs.dilations, out_sp, attrs.strides)
        )

    if group == c and w.shape[1] == 1:  # depthwise (channel multiplier cout // c)
        mult = cout // c
        wg = wf.reshape(c, mult, taps)
        out = np.zeros((n, c, mult, *out_sp), dtype)
        for k, tap in enumerate(np.ndindex(*kernel)):
            xs = x[tap_slice(tap)][:, :, None]
            out += xs * wg[:, :, k].reshape((1, c, mult) + (1,) * nd)
        return out.reshape(n, cout, *out_sp), None
    size = math.prod(out_sp)
    if taps == 1 and not any(pads) and all(s == 1 for s in attrs.strides):
        cols = x.reshape(n, c, size)
    else:
        cols = np.empty((n, c, taps, size), dtype)
        for k, tap in enumerate(np.ndindex(*kernel)):
            cols[:, :, k] = x[tap_slice(tap)].reshape(n, c, size)
    cols = cols.reshape(n, group, cg * taps, size)
    wmat = wf.reshape(group, og, cg * taps)
    out = np.matmul(wmat[None], cols)  # [N, group, og, size]
    return out.reshape(n, cout, *out_sp), None


def conv_transpose_accumulate(
    xc: np.ndarray,
    w: np.ndarray,
    attrs: ConvGeometry,
    exact: ExactConvs | None = None,
    key: object = None,
    x_bound: float | None = None,
) -> np.ndarray:
    """Exact integer transposed convolution (group 1 or grouped): onnxruntime's float32
    ConvTranspose when its sums are exact there (ortconv), else by scattering kernel taps in
    float64."""
    if exact is not None:
        pads = list(attrs.pads) or [0] * 2 * (w.ndim - 2)
        exact32 = exact.sums(xc, w, attrs, pads, True, key, x_bound)
        if exact32 is not None:
            return exact32[0]
    group = attrs.group
    n, c = xc.shape[:2]
    kernel = list(w.shape[2:])
    nd = len(kernel)
    strides, dil = attrs.strides, attrs.dilations
    pads = attrs.pads if attrs.pads else [0] * 2 * nd
    out_pad = attrs.output_padding or [0] * nd
    cg, og = c // group, w.shape[1]
    in_sp = xc.shape[2:]
    full = [
        (i - 1) * s + (k - 1) * d + 1 + op for i, s, k, d, op in zip(in_sp, strides, kernel, dil, out_pad)
    ]
    out = np.zeros((n, og * group, *full), np.float64)
    wf = w.astype(np.float64)
    for g in range(group):
        xg = xc[:, g * cg : (g + 1) * cg].astype(np.float64)
        for tap in np.ndindex(*kernel):
            taps = wf[(slice(g * cg, (g + 1) * cg), slice(None)) + tuple(tap)]
            contrib = np.einsum("nc...,co->no...", xg, taps)
            index = (slice(None), slice(g * og, (g + 1) * og)) + tuple(
                slice(t * d, t * d + (i - 1) * s + 1, s) for t, d, i, s in zip(tap, dil, in_sp, strides)
            )
            out[index] += contrib
    crop = (slice(None), slice(None)) + tuple(slice(pads[i], full[i] - pads[i + nd]) for i in range(nd))
    return out[crop]


def pool_pads(spatial, attrs: PoolAttrs) -> list[int]:
    """Explicit pads plus what ceil_mode adds at the end of each axis."""
    kernel = attrs.kernel_shape
    nd = len(kernel)
    strides = attrs.strides or [1] * nd
    dilations = attrs.dilations or [1] * nd
    pads = list(attrs.pads or [0] * 2 * nd)
    if attrs.ceil_mode:
        for i in range(nd):
            size = spatial[i] + pads[i] + pads[i + nd]
            span = (kernel[i] - 1) * dilations[i] + 1
            out = math.ceil((size - span) / strides[i]) + 1
            if (out - 1) * strides[i] >= spatial[i] + pads[i]:  # ONNX: the last window must start inside
                out -= 1
            pads[i + nd] += max((out - 1) * strides[i] + span - size, 0)
    return pads


def pool_counts(spatial, attrs: PoolAttrs) -> np.ndarray:
    """How many elements each average-pool window divides by (ONNX semantics)."""
    kernel, nd = attrs.kernel_shape, len(attrs.kernel_shape)
    strides = attrs.strides or [1] * nd
    pads = pool_pads(spatial, attrs)
    ones = np.ones((1, 1, *spatial))
    if attrs.count_include_pad:
        explicit = list(attrs.pads or [0] * 2 * nd)
        ones = np.pad(
            ones, [(0, 0), (0, 0)] + [(explicit[i], explicit[i + nd]) for i in range(nd)], constant_values=1
        )
        extra = [0] * nd + [p - e for p, e in zip(pads[nd:], explicit[nd:])]
        win = windows(ones, kernel, strides, [1] * nd, extra, 0.0)
    else:
        win = windows(ones, kernel, strides, [1] * nd, pads, 0.0)
    return win.sum(axis=tuple(range(-nd, 0)))[0, 0].astype(np.int64)


def nearest_indices(size_in: int, size_out: int, attrs: ResizeAttrs) -> np.ndarray:
    """The source index of each output position of a nearest-neighbour Resize along one axis."""
    scale = size_out / size_in
    o = np.arange(size_out, dtype=np.float64)
    if attrs.coordinate_transformation_mode == "asymmetric":
        src = o / scale
    else:
        src = (o + 0.5) / scale - 0.5
    mode = attrs.nearest_mode
    if mode == "floor":
        idx = np.floor(src)
    elif mode == "ceil":
        idx = np.ceil(src)
    elif mode == "round_prefer_ceil":
        idx = np.floor(src + 0.5)
    else:
        idx = np.ceil(src - 0.5)
    return np.clip(idx, 0, size_in - 1).astype(np.int64)
