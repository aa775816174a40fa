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

from npubuild.stages.quantize.planning import attr, node_label

# How many calibration samples make H: each gives every output position of a convolution (or
# every token of a MatMul) as a row, so a few thousand rows per sample; 16 spread evenly.
MAX_SAMPLES = 16
# H is trusted only from at least this many input rows per weight column: a layer after a global
# pool (a classifier, a squeeze-excite) sees one row per sample, and with fewer rows than
# columns GPTQ fits the rounding to those few inputs (orientation's classifier: 25.4 -> 20.6 dB
# on calibration images before this rule).
MIN_ROWS_PER_COLUMN = 10
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


def _conv_rows(x: np.ndarray, node: onnx.NodeProto, w: np.ndarray) -> np.ndarray:
    """A convolution's im2col rows, [positions, group, Cin/group * taps], the taps' order that of
    the weight's [Cout, Cin/group, k...] flattened."""
    if w.ndim == 3:  # 1-D: a 2-D convolution of height 1
        x, w = x[:, :, None, :], w[:, :, None, :]
        node_attrs = {
            "strides": [1, *attr(node, "strides", [1])],
            "pads": [0, attr(node, "pads", [0, 0])[0], 0, attr(node, "pads", [0, 0])[1]],
            "dilations": [1, *attr(node, "dilations", [1])],
        }
    else:
        node_attrs = {
            "strides": attr(node, "strides", [1, 1]),
            "pads": attr(node, "pads", [0, 0, 0, 0]),
            "dilations": attr(node, "dilations", [1, 1]),
        }
    group = attr(node, "group", 1)
    (sh, sw), (dh, dw), pads = node_attrs["strides"], node_attrs["dilations"], node_attrs["pads"]
    kh, kw = w.shape[2:]
    padded = np.pad(x[0], ((0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
    span = ((kh - 1) * dh + 1, (kw - 1) * dw + 1)
    windows = sliding_window_view(padded, span, axis=(1, 2))[:, ::sh, ::sw, ::dh, ::dw]  # C, Ho, Wo, kh, kw
    channels = x.shape[1]
    rows = windows.transpose(1, 2, 0, 3, 4).reshape(-1, group, channels // group * kh * kw)
    return rows


def layer_rows(node: onnx.NodeProto, x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """The layer's input vectors as [rows, group, D] (float64)."""
    x = np.asarray(x, np.float64)
    if node.op_type == "Conv":
        return _conv_rows(x, node, w)
    return x.reshape(-1, 1, x.shape[-1])


def gram_matrices(model: onnx.ModelProto, constants: dict, feeds: list[dict]) -> dict[str, np.ndarray]:
    """H = sum x x^T per covered layer (label -> [group, D, D]) over the feeds, in onnxruntime,
    for the layers with enough rows (MIN_ROWS_PER_COLUMN). Sums run with one BLAS thread: the
    same bytes on a one-thread worker and a laptop."""
    from threadpoolctl import threadpool_limits

    from npubuild.stages.feeds import session
    from npubuild.stages.onnx_utils import with_outputs

    layers = [n for n in model.graph.node if covered(n, constants)]
    wanted = sorted({n.input[0] for n in layers} - set(feeds[0]) if feeds else set())
    sess = session(with_outputs(model, wanted))
    outputs = [o.name for o in sess.get_outputs()]
    grams: dict[str, np.ndarray] = {}
    counts: dict[str, int] = {}
    with threadpool_limits(1, user_api="blas"):
        for feed in feeds:
            values = {**dict(zip(outputs, sess.run(outputs, feed))), **feed}
            for node in layers:
                rows = layer_rows(node, values[node.input[0]], constants[node.input[1]])
                gram = np.stack([rows[:, g].T @ rows[:, g] for g in range(rows.shape[1])])
                label = node_label(node)
                grams[label] = grams[label] + gram if label in grams else gram
                counts[label] = counts.get(label, 0) + rows.shape[0]
    return {label: g for label, g in grams.items() if counts[label] >= MIN_ROWS_PER_COLUMN * g.shape[-1]}


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
