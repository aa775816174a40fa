"""Cross-layer equalization (Nagel et al. 2019, "Data-Free Quantization Through Weight Equalization
and Bias Correction"; AIMET's CLE), `quantize = {"equalize": true}`.

Where a convolution's output reaches other convolutions only through an activation that commutes
with a positive scale (ReLU, LeakyReLU, PReLU: f(x / s) = f(x) / s) or through nothing, output
channel c of the first can be divided by s_c and input channel c of the readers multiplied by
s_c: the float model computes the same. Choosing s_c = sqrt(r1_c / r2_c), with r1_c the largest
|weight| of the first layer's channel c and r2_c the readers' largest |weight| on input channel
c, gives both the same range, sqrt(r1_c * r2_c). A depthwise-separable net whose depthwise
channels' weights differ by 100x then no longer leaves most channels a few int8 steps wide.

It runs once, after the passes' fixpoint, in optimize: the scaled model is `optimized.onnx`, the
float model every later stage reads by tensor name (calibrate's statistics, evaluate's per-layer
comparison, the CPU subgraphs' float nodes), so the integer model and its float reference agree
tensor by tensor. It is data-free: only weights are read.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx

from npubuild.stages.optimize.graph import Graph, node_attr
from npubuild.stages.optimize.passes import rescale_conv

# f(x / s) = f(x) / s for every s > 0, so a per-channel scale passes through unchanged
HOMOGENEOUS = ("Relu", "LeakyRelu", "PRelu")
MAX_ROUNDS = 32  # chains (conv -> conv -> conv) converge in a few rounds; a bound, not a goal
CONVERGED = 1e-3  # the largest |log s| of a round below which equalization stops
SMALLEST = 1e-12  # a channel whose weights or measured values are (nearly) zero keeps its scale


@dataclass(frozen=True)
class Pair:
    """A convolution whose every output channel reaches `readers` (convolutions) only through
    the tensor `shared`, scaled or not by a homogeneous activation."""

    first: onnx.NodeProto
    shared: str
    readers: tuple[onnx.NodeProto, ...]


def _float_weight(g: Graph, conv: onnx.NodeProto) -> np.ndarray | None:
    weight = g.constant(conv.input[1]) if len(conv.input) > 1 else None
    if weight is None or weight.dtype != np.float32 or weight.ndim < 3:
        return None
    if len(conv.input) > 2 and conv.input[2] and g.constant(conv.input[2]) is None:
        return None  # a computed bias cannot be rescaled
    return weight


def find_pairs(g: Graph) -> list[Pair]:
    """Every convolution whose output can be equalized with the convolutions that read it."""
    uses = g.consumers()
    outputs = g.output_names()
    pairs = []
    for first in g.nodes:
        if first.op_type != "Conv" or _float_weight(g, first) is None:
            continue
        shared = first.output[0]
        readers = uses.get(shared, [])
        if len(readers) == 1 and readers[0].op_type in HOMOGENEOUS and shared not in outputs:
            shared = readers[0].output[0]
            readers = uses.get(shared, [])
        if shared in outputs or first.output[0] in outputs or not readers:
            continue
        channels = _float_weight(g, first).shape[0]
        if all(_reads_channels(g, r, shared, channels) for r in readers):
            pairs.append(Pair(first, shared, tuple(readers)))
    return pairs


def _reads_channels(g: Graph, reader: onnx.NodeProto, shared: str, channels: int) -> bool:
    """Whether `reader` is a convolution taking `shared` as its data input only, `channels` wide."""
    if reader.op_type != "Conv" or reader.input[0] != shared or shared in reader.input[1:]:
        return False
    weight = _float_weight(g, reader)
    return weight is not None and weight.shape[1] * node_attr(reader, "group", 1) == channels


def _grouped(weight: np.ndarray, group: int) -> np.ndarray:
    """A reader's weight as [group, outputs per group, inputs per group, taps]."""
    out, per_group = weight.shape[:2]
    return weight.reshape(group, out // group, per_group, -1)


def _input_ranges(weight: np.ndarray, group: int) -> np.ndarray:
    """The largest |weight| on each input channel of a (grouped) convolution."""
    return np.abs(_grouped(weight, group)).max(axis=(1, 3)).reshape(-1)


def _scale_inputs(weight: np.ndarray, group: int, scale: np.ndarray) -> np.ndarray:
    grouped = _grouped(weight.astype(np.float64), group)
    scaled = grouped * scale.reshape(group, 1, -1, 1)
    return scaled.reshape(weight.shape).astype(np.float32)


def measurable(*ranges: np.ndarray) -> np.ndarray:
    """The channels every range gives a finite, non-zero scale for; the others keep scale 1."""
    return np.logical_and.reduce([(r > SMALLEST) & np.isfinite(r) for r in ranges])


def reader_ranges(g: Graph, pair: Pair) -> np.ndarray:
    """The readers' largest |weight| on each channel of the pair's shared tensor."""
    ranges = [_input_ranges(_float_weight(g, r), node_attr(r, "group", 1)) for r in pair.readers]
    return np.max(ranges, axis=0).astype(np.float64)


def scale_pair(g: Graph, pair: Pair, scale: np.ndarray) -> bool:
    """Divide the shared tensor's channel c by scale[c]: the first convolution's output channel
    divided, the readers' input channel multiplied. False (nothing changed) when the first
    convolution cannot be rescaled."""
    if not rescale_conv(g, pair.first, 1 / scale, np.zeros_like(scale)):
        return False
    for reader in pair.readers:
        scaled = _scale_inputs(_float_weight(g, reader), node_attr(reader, "group", 1), scale)
        reader.input[1] = g.add_constant(f"{reader.name or reader.output[0]}.weight", scaled)
    return True


def _equalize(g: Graph, pair: Pair) -> float:
    """Equalize one pair in place; returns the largest |log s| it applied."""
    first = _float_weight(g, pair.first)
    r1 = np.abs(first.reshape(first.shape[0], -1)).max(axis=1).astype(np.float64)
    r2 = reader_ranges(g, pair)
    scale = np.sqrt(np.divide(r1, r2, out=np.ones_like(r1), where=measurable(r1, r2)))
    return float(np.abs(np.log(scale)).max()) if scale_pair(g, pair, scale) else 0.0


def equalize(g: Graph) -> dict:
    """Equalize every pair, round after round until no scale moves by more than 0.1%: a layer
    that is the reader of one pair and the first of the next is balanced between both."""
    pairs = find_pairs(g)
    rounds = 0
    while pairs and rounds < MAX_ROUNDS:
        rounds += 1
        # the nodes are edited in place (their weight inputs renamed), so the pairs stay valid
        if max(_equalize(g, p) for p in pairs) < CONVERGED:
            break
    return {"pairs": len(pairs), "rounds": rounds}


def equalize_model(model: onnx.ModelProto) -> tuple[onnx.ModelProto, dict | None]:
    """The optimized model equalized, and what equalization did; a pre-quantized model as it is
    (None): its grids are of the tensors as they stand, and scaling would void them."""
    graph = Graph(model)
    if graph.qdq:
        return model, None
    report = equalize(graph)
    return graph.to_model(keep_value_info=True), report
