"""Activation-to-weight scale migration (SmoothQuant, Xiao et al. 2023), `quantize = {"smooth":
alpha}` (0.3 by default; None is off).

A transformer's LayerNorm output has a few channels 10-100x wider than the rest, and its int8 grid
is one scale for all of them, so the narrow channels get a few steps. Those channels are read only
by MatMuls whose weight rows they multiply, so channel j can be divided by s_j (the LayerNorm's
gamma and beta divided) and weight row j multiplied by it: the float model computes the same.
s_j = max|X_j|^alpha / max|W_j|^(1 - alpha) moves part of the activation's spread into the
weights, whose values are flatter and lose less to int8 rounding. max|X_j| is measured on
calibration samples in onnxruntime (optimize has them for its check). With
`smooth_convolutions` the same rule also serves ReLU-joined convolution pairs (equalize.py's).

Like cross-layer equalization (equalize.py) it runs in optimize, after the passes' fixpoint, so
the smoothed model is `optimized.onnx`, the float model every later stage reads by tensor name.
"""

from __future__ import annotations

import numpy as np
import onnx

from npubuild.stages.feeds import float_values, samples_for
from npubuild.stages.optimize.equalize import find_pairs, measurable, reader_ranges, scale_pair
from npubuild.stages.optimize.graph import Graph

LAYERNORMS = ("LayerNormalization", "LayerNorm")  # onnx's (opset >= 17) and fuse_layernorm's function
SAMPLES = 16  # calibration samples whose per-channel maxima set the scales


def find_groups(g: Graph) -> list[tuple[onnx.NodeProto, list[onnx.NodeProto]]]:
    """Each LayerNorm with a constant gamma and beta whose output only matrix products with
    constant 2-D weights read, as their left operand, directly or through Reshapes that keep the
    last axis (matmul_bias_as_gemm's view to [rows, K]): the channels the scale can move through."""
    uses, outputs = g.consumers(), g.output_names()
    groups = []
    for norm in g.nodes:
        if norm.op_type not in LAYERNORMS or len(norm.input) < 3 or norm.output[0] in outputs:
            continue
        gamma, beta = g.constant(norm.input[1]), g.constant(norm.input[2])
        if gamma is None or beta is None or gamma.dtype != np.float32 or gamma.ndim != 1:
            continue
        readers = _row_readers(g, norm.output[0], gamma.shape[0], uses, outputs)
        if readers:
            groups.append((norm, readers))
    return groups


def _row_readers(
    g: Graph, tensor: str, channels: int, uses: dict, outputs: set[str]
) -> list[onnx.NodeProto] | None:
    """The matrix products that read `tensor`'s rows, seen through row-keeping Reshapes; None
    when anything else reads it (or a graph output is among them). `uses` and `outputs`: the
    graph's consumers and output names, read once by find_groups."""
    readers: list[onnx.NodeProto] = []
    for reader in uses.get(tensor, []):
        shape = g.shape(reader.output[0]) if reader.op_type == "Reshape" else None
        if shape and shape[-1] == channels and reader.input[0] == tensor and reader.output[0] not in outputs:
            inner = _row_readers(g, reader.output[0], channels, uses, outputs)
            if not inner:
                return None
            readers += inner
        elif _reads_rows(g, reader, tensor, channels):
            readers.append(reader)
        else:
            return None
    return readers


def _reads_rows(g: Graph, reader: onnx.NodeProto, tensor: str, channels: int) -> bool:
    if reader.op_type not in ("MatMul", "Gemm") or reader.input[0] != tensor or reader.input[1] == tensor:
        return False
    if reader.op_type == "Gemm" and any(a.name in ("transA", "transB") and a.i for a in reader.attribute):
        return False
    weight = g.constant(reader.input[1])
    return weight is not None and weight.dtype == np.float32 and weight.shape == (channels, weight.shape[-1])


def _channel_maxima(model: onnx.ModelProto, tensors: np.ndarray, named_axes: list[tuple[str, int]]):
    """The largest |value| of each channel (along the given axis) of each tensor over the
    calibration samples."""
    maxima: list = [None] * len(named_axes)
    names = [name for name, _ in named_axes]
    for values in float_values(model, names, samples_for(model, tensors, SAMPLES)):
        for k, (name, axis) in enumerate(named_axes):
            value = np.moveaxis(np.abs(np.asarray(values[name], np.float64)), axis, -1)
            peak = value.reshape(-1, value.shape[-1]).max(axis=0)
            maxima[k] = peak if maxima[k] is None else np.maximum(maxima[k], peak)
    return maxima


def migration(activation: np.ndarray, weight: np.ndarray, alpha: float) -> np.ndarray:
    """SmoothQuant's s_j = max|X_j|^alpha / max|W_j|^(1 - alpha); 1 where either is zero."""
    usable = measurable(activation, weight)
    scale = np.ones(activation.shape, np.float64)
    scale[usable] = activation[usable] ** alpha / weight[usable] ** (1 - alpha)
    return scale


def smooth_model(
    model: onnx.ModelProto, tensors: np.ndarray, alpha: float, convolutions: bool = False
) -> tuple[onnx.ModelProto, dict | None]:
    """The optimized model smoothed at strength `alpha`: each LayerNorm -> MatMul group, and with
    `convolutions` each convolution pair cross-layer equalization would take (a convolution's
    output reaching other convolutions through ReLU or nothing), by the activation's measured
    channel maxima instead of the first layer's weights; and what it did. A pre-quantized model
    as it is (None): its grids are of the tensors as they stand."""
    graph = Graph(model)
    if graph.qdq:
        return model, None
    norms, pairs = find_groups(graph), find_pairs(graph) if convolutions else []
    report = {"layernorms": len(norms), "convolution_pairs": len(pairs)}
    if not norms and not pairs:
        return model, report
    named_axes = [(norm.output[0], -1) for norm, _ in norms] + [(pair.shared, 1) for pair in pairs]
    maxima = _channel_maxima(model, tensors, named_axes)
    if any(peak is None for peak in maxima):  # no sample to measure on: nothing to migrate by
        return model, {"layernorms": 0, "convolution_pairs": 0}
    for (norm, readers), activation in zip(norms, maxima):
        weight = np.max([np.abs(graph.constant(r.input[1])).max(axis=1) for r in readers], axis=0)
        scale = migration(activation, weight.astype(np.float64), alpha)
        base = norm.name or norm.output[0]
        for k, part in ((1, "gamma"), (2, "beta")):
            value = graph.constant(norm.input[k]).astype(np.float64) / scale
            norm.input[k] = graph.add_constant(f"{base}.{part}", value.astype(np.float32))
        for reader in readers:
            value = graph.constant(reader.input[1]).astype(np.float64) * scale[:, None]
            reader.input[1] = graph.add_constant(
                f"{reader.name or reader.output[0]}.weight", value.astype(np.float32)
            )
    for pair, activation in zip(pairs, maxima[len(norms) :]):
        # the readers' ranges as they are now: a convolution read by one pair and first of the next
        # has had its input channels scaled already, in graph order
        scale_pair(graph, pair, migration(activation, reader_ranges(graph, pair), alpha))
    return graph.to_model(keep_value_info=True), report
