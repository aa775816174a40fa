"""Error-compensating weight rounding (GPTQ, Frantar et al. 2023; the OBQ update of Frantar and
Alistarh 2022): each MAC layer's int8 weights are rounded one input column at a time, and the
rounding error of each column is spread over the columns not yet rounded, weighted by how the
calibration inputs correlate, so that the layer's *output* on those inputs moves least.

Rounding each weight to its nearest step minimises the weights' own error; what the network
sees is `W x`, and for inputs whose features correlate (neighbouring taps of a convolution, a
MatMul's embedding) the errors of nearest rounding add up where other roundings of the same
weights would cancel. With H = sum x x^T over the calibration inputs (im2col rows of a
convolution), the output error of a weight error d is d^T H d; GPTQ rounds column i, then moves
the remaining columns by -(err_i / [H^-1]_ii) [H^-1]_i,j>i, the least-squares compensation.
Scales stay those of nearest rounding (max |w| / 127 per output channel): only which of the two
neighbouring codes a weight takes changes, so every later phase (the analytic bias correction,
the QDQ export, codegen) reads the codes as before.

Measured (docs/quantization.md, "Error-compensating weight rounding"): with the weights alone
quantized it gains 4-7 dB on the validation split, but in the integer model, where the
activations' rounding dominates, it lost on all three validation models, so it is an option
(`quantize = {"weight_rounding": "gptq"}`), not the default.

Covered: Conv (1-D and 2-D, any group, explicit pads) and MatMul/Gemm with a constant [K, N]
weight. A ConvTranspose keeps nearest rounding (each input position feeds several outputs
through different taps: its rows are not one input vector).
"""

from __future__ import annotations

import numpy as np
import onnx
from numpy.lib.stride_tricks import sliding_window_view

from npubuild.stages.quantize.graphinfo import attr, node_label

# How many calibration samples make H: each gives every output position of a convolution (or
# every token of a MatMul) as a row, so a few thousand rows per sample; 16 spread evenly.
MAX_SAMPLES = 16
# H is trusted only from at least this many input rows per weight column: a layer after a global
# pool (a classifier, a squeeze-excite) sees one row per sample, and with fewer rows than
# columns GPTQ fits the rounding to those few inputs (orientation's classifier: 25.4 -> 20.6 dB
# on calibration images before this rule).
MIN_ROWS_PER_COLUMN = 10
# Bounds on what H costs: its bytes per layer (a 25,088-wide classifier input would need 5 GB;
# such a layer keeps nearest rounding) and the rows copied out of a feature map at a time.
MAX_GRAM_BYTES = 2**28
ROWS_PER_CHUNK = 4096
# Added to H's diagonal, as a fraction of its mean: H of a layer whose inputs are nearly
# collinear is near-singular, and its inverse would move weights by large amounts.
DAMPING = 0.01


def covered(node: onnx.NodeProto, constants: dict) -> bool:
    """Whether GPTQ rounds this node's weights."""
    if len(node.input) < 2 or node.input[1] not in constants:
        return False
    w = constants[node.input[1]]
    if node.op_type == "Conv":
        return w.ndim in (3, 4) and attr(node, "auto_pad", "NOTSET") in ("NOTSET", b"NOTSET")
    if node.op_type == "MatMul":
        return w.ndim == 2
    if node.op_type == "Gemm":
        return w.ndim == 2 and not attr(node, "transA", 0)
    return False


def _conv_windows(x: np.ndarray, node: onnx.NodeProto, w: np.ndarray):
    """Per batch item, a view [C, Ho, Wo, kh, kw] of every output position's input window, and
    the rows' width D = Cin/group * taps (a 1-D convolution as a 2-D one of height 1)."""
    if w.ndim == 3:
        x, w = x[:, :, None, :], w[:, :, None, :]
        ends = attr(node, "pads", [0, 0])
        strides, dilations = [1, *attr(node, "strides", [1])], [1, *attr(node, "dilations", [1])]
        pads = [0, ends[0], 0, ends[1]]
    else:
        strides, dilations = attr(node, "strides", [1, 1]), attr(node, "dilations", [1, 1])
        pads = attr(node, "pads", [0, 0, 0, 0])
    kh, kw = w.shape[2:]
    span = ((kh - 1) * dilations[0] + 1, (kw - 1) * dilations[1] + 1)
    views = []
    for item in x:
        padded = np.pad(item, ((0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
        windows = sliding_window_view(padded, span, axis=(1, 2))
        views.append(windows[:, :: strides[0], :: strides[1], :: dilations[0], :: dilations[1]])
    return views, x.shape[1] // attr(node, "group", 1) * kh * kw


def row_count(node: onnx.NodeProto, x: np.ndarray, w: np.ndarray) -> int:
    """How many input vectors one sample gives the layer (no copy made)."""
    if node.op_type == "Conv":
        views, _ = _conv_windows(np.asarray(x), node, w)
        return sum(v.shape[1] * v.shape[2] for v in views)
    return int(np.prod(np.shape(x)[:-1]))


def layer_row_chunks(node: onnx.NodeProto, x: np.ndarray, w: np.ndarray):
    """The layer's input vectors as [rows, group, D] (float64) blocks of about ROWS_PER_CHUNK rows,
    a convolution's im2col rows in the order of the weight's [Cout, Cin/group, k...] flattened: a
    large feature map is never copied whole."""
    x = np.asarray(x, np.float64)
    if node.op_type != "Conv":
        flat = x.reshape(-1, 1, x.shape[-1])
        for start in range(0, len(flat), ROWS_PER_CHUNK):
            yield flat[start : start + ROWS_PER_CHUNK]
        return
    group = attr(node, "group", 1)
    views, depth = _conv_windows(x, node, w)
    for windows in views:  # [C, Ho, Wo, kh, kw]
        step = max(1, ROWS_PER_CHUNK // windows.shape[2])
        for top in range(0, windows.shape[1], step):
            block = windows[:, top : top + step].transpose(1, 2, 0, 3, 4)
            yield block.reshape(-1, group, depth)


def layer_rows(node: onnx.NodeProto, x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """All of layer_row_chunks at once, [rows, group, D]."""
    return np.concatenate(list(layer_row_chunks(node, x, w)))


def gram_matrices(model: onnx.ModelProto, constants: dict, feeds: list[dict]) -> dict[str, np.ndarray]:
    """H = sum x x^T per covered layer (label -> [group, D, D]) over the feeds, in onnxruntime,
    for the layers with enough rows (MIN_ROWS_PER_COLUMN, judged before any H is made) and an H
    of at most MAX_GRAM_BYTES. Sums run with one BLAS thread: the same bytes on a one-thread
    worker and a laptop."""
    from threadpoolctl import threadpool_limits

    from npubuild.stages.feeds import float_values

    layers = [n for n in model.graph.node if covered(n, constants)]
    grams: dict[str, np.ndarray] = {}
    skipped: set[str] = set()
    with threadpool_limits(1, user_api="blas"):
        for values in float_values(model, sorted({n.input[0] for n in layers}), feeds):
            for node in layers:
                label, x, w = node_label(node), values[node.input[0]], constants[node.input[1]]
                if label in skipped:
                    continue
                if label not in grams:
                    groups = attr(node, "group", 1) if node.op_type == "Conv" else 1
                    depth = w[0].size if node.op_type == "Conv" else x.shape[-1]
                    rows = row_count(node, x, w) * len(feeds)
                    if rows < MIN_ROWS_PER_COLUMN * depth or groups * depth * depth * 8 > MAX_GRAM_BYTES:
                        skipped.add(label)
                        continue
                    grams[label] = np.zeros((groups, depth, depth))
                for block in layer_row_chunks(node, x, w):
                    for g in range(block.shape[1]):
                        grams[label][g] += block[:, g].T @ block[:, g]
    return grams


def round_weights(weights: np.ndarray, scales: np.ndarray, gram: np.ndarray) -> np.ndarray:
    """int8 codes of `weights` [group, R, D] on `scales` [group, R] (one per row), rounded column
    by column with the error of each spread over the later columns through H = `gram`
    [group, D, D]. Inputs H never saw (a zero diagonal) keep nearest rounding."""
    from threadpoolctl import threadpool_limits

    w = np.array(weights, np.float64)
    h = np.array(gram, np.float64)
    groups, _, depth = w.shape
    diag = np.einsum("gii->gi", h)
    dead = diag == 0
    h[:, np.arange(depth), np.arange(depth)] += np.where(dead, 1.0, 0.0)
    damping = DAMPING * np.maximum(np.einsum("gii->gi", h).mean(axis=1), 1e-12)
    h[:, np.arange(depth), np.arange(depth)] += damping[:, None]
    with threadpool_limits(1, user_api="blas"):
        # the upper Cholesky factor of H^-1: row i holds the compensation of column i's error
        upper = np.linalg.cholesky(np.linalg.inv(h)).transpose(0, 2, 1)
    scale = np.asarray(scales, np.float64)
    codes = np.zeros(w.shape, np.int8)
    for i in range(depth):
        column = w[:, :, i]
        q = np.clip(np.rint(column / scale), -127, 127)
        codes[:, :, i] = q
        error = np.where(dead[:, i, None], 0.0, (column - q * scale) / upper[:, i, i, None])
        w[:, :, i + 1 :] -= error[:, :, None] * upper[:, None, i, i + 1 :]
    return codes


def rounded_codes(op_type: str, w: np.ndarray, scales: np.ndarray, gram: np.ndarray) -> np.ndarray:
    """GPTQ's codes for a layer's weight in the encoder's layout: a Conv's [Cout, Cin/group, k...]
    (scales per Cout), a MatMul's [K, N] (scales per N)."""
    if op_type == "Conv":
        groups = gram.shape[0]
        rows = w.reshape(groups, w.shape[0] // groups, -1)
        return round_weights(rows, scales.reshape(groups, -1), gram).reshape(w.shape)
    return round_weights(w.T[None], scales[None], gram)[0].T
