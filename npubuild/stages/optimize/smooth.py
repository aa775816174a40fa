"""Activation-to-weight scale migration (SmoothQuant, Xiao et al. 2023), `quantize = {"smooth":
alpha}`.

A transformer's LayerNorm output has a few channels 10-100x wider than the rest, and its int8 grid
is one scale for all of them, so the narrow channels get a few steps. Those channels are read only
by MatMuls whose weight rows they multiply, so channel j can be divided by s_j (the LayerNorm's
gamma and beta divided) and weight row j multiplied by it: the float model computes the same.
s_j = max|X_j|^alpha / max|W_j|^(1 - alpha) moves part of the activation's spread into the
weights, whose int8 scales are per output channel and absorb it better. max|X_j| is measured on
calibration samples in onnxruntime (optimize has them for its check).

Like cross-layer equalization (equalize.py) it runs in optimize, after the passes' fixpoint, so
the smoothed model is `optimized.onnx`, the float model every later stage reads by tensor name.
"""

from __future__ import annotations

import numpy as np
import onnx

from npubuild.stages.feeds import float_values, samples_for
from npubuild.stages.optimize.graph import Graph

LAYERNORMS = ("LayerNormalization", "LayerNorm")  # onnx's (opset >= 17) and fuse_layernorm's function
SAMPLES = 16  # calibration samples whose per-channel maxima set the scales
SMALLEST = 1e-12  # a channel that is (nearly) zero in the samples or the weights keeps its scale


def find_groups(g: Graph) -> list[tuple[onnx.NodeProto, list[onnx.NodeProto]]]:
    """Each LayerNorm with a constant gamma and beta whose output only MatMuls with constant 2-D
    weights read, as their left operand: the channels the scale can move through."""
    uses = g.consumers()
    outputs = g.output_names()
    groups = []
    for norm in g.nodes:
        if norm.op_type not in LAYERNORMS or len(norm.input) < 3 or norm.output[0] in outputs:
            continue
        gamma, beta = g.constant(norm.input[1]), g.constant(norm.input[2])
        if gamma is None or beta is None or gamma.dtype != np.float32 or gamma.ndim != 1:
            continue
        readers = uses.get(norm.output[0], [])
        if readers and all(_reads_rows(g, r, norm.output[0], gamma.shape[0]) for r in readers):
            groups.append((norm, readers))
    return groups


def _reads_rows(g: Graph, reader: onnx.NodeProto, tensor: str, channels: int) -> bool:
    if reader.op_type != "MatMul" or reader.input[0] != tensor or reader.input[1] == tensor:
        return False
    weight = g.constant(reader.input[1])
    return weight is not None and weight.dtype == np.float32 and weight.shape == (channels, weight.shape[-1])


def _channel_maxima(model: onnx.ModelProto, names: list[str], tensors: np.ndarray) -> list[np.ndarray]:
    """The largest |value| of each last-axis channel of each tensor over the calibration samples."""
    maxima = [None] * len(names)
    for values in float_values(model, names, samples_for(model, tensors, SAMPLES)):
        for k, name in enumerate(names):
            value = np.abs(np.asarray(values[name], np.float64))
            peak = value.reshape(-1, value.shape[-1]).max(axis=0)
            maxima[k] = peak if maxima[k] is None else np.maximum(maxima[k], peak)
    return maxima


def smooth_model(
    model: onnx.ModelProto, tensors: np.ndarray, alpha: float
) -> tuple[onnx.ModelProto, dict | None]:
    """The optimized model with each LayerNorm -> MatMul group smoothed at strength `alpha`, and
    what it did; a pre-quantized model as it is (None): its grids are of the tensors as they stand."""
    graph = Graph(model)
    if graph.qdq:
        return model, None
    groups = find_groups(graph)
    if not groups:
        return model, {"layernorms": 0}
    maxima = _channel_maxima(model, [norm.output[0] for norm, _ in groups], tensors)
    for (norm, readers), activation in zip(groups, maxima):
        weight = np.max([np.abs(graph.constant(r.input[1])).max(axis=1) for r in readers], axis=0)
        usable = (activation > SMALLEST) & (weight > SMALLEST) & np.isfinite(activation)
        scale = np.ones_like(activation)
        scale[usable] = activation[usable] ** alpha / weight[usable].astype(np.float64) ** (1 - alpha)
        base = norm.name or norm.output[0]
        for k, part in ((1, "gamma"), (2, "beta")):
            value = graph.constant(norm.input[k]).astype(np.float64) / scale
            norm.input[k] = graph.add_constant(f"{base}.{part}", value.astype(np.float32))
        for reader in readers:
            value = graph.constant(reader.input[1]).astype(np.float64) * scale[:, None]
            reader.input[1] = graph.add_constant(
                f"{reader.name or reader.output[0]}.weight", value.astype(np.float32)
            )
    return graph.to_model(keep_value_info=True), {"layernorms": len(groups)}
