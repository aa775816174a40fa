"""fuse: fold a photo data set's declared preprocessing into the model (`fuse_preprocess = True`).

The fused model takes the photo's pixel values, 0..255 in the order the decoder gives them (RGB,
or one GRAY channel), NCHW; a 1x1 convolution in front does what `preprocess` declared: the
channel swap to BGR, `* scale`, `- mean`, `/ std`. On the integer model that input's grid is the
pixel grid itself (scale 1, zero point -128), so the .npub takes uint8 bytes and no float
conversion runs on the CPU (TPU-MLIR's --fuse_preprocess). Resizing stays on the host: the model
takes the size its input shape says.

Where it is exact, the head is folded into the convolutions that read the photo instead (their
weights times the head's, their biases plus the head's bias through them): when every reader is
an ungrouped convolution with constant weights and either the head has no bias (no mean: a zero
pixel is a zero input, so the padding still pads zeros) or no reader pads. YOLOv8n's `/255` is
one: a 1x1 convolution of 3 channels keeps the MAC array a tenth full for a whole photo's
positions (15,550 of its 1.19M estimated cycles on vnpu-m), and the fold removes it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from npubuild.errors import UserError
from npubuild.stages.onnx_utils import dims, load_model, node_attributes, save_model
from npubuild.stages.quantize.graphinfo import FUSED_HEAD


def head_weights(preprocess: dict, channels: int) -> tuple[np.ndarray, np.ndarray]:
    """The 1x1 convolution's weight [C, C, 1, 1] and bias [C]: output channel c (the model's order)
    is pixel channel src(c) * scale / std_c - mean_c / std_c."""
    mean = np.broadcast_to(np.asarray(preprocess["mean"], np.float64), (channels,))
    std = np.broadcast_to(np.asarray(preprocess["std"], np.float64), (channels,))
    source = list(range(channels))[::-1] if preprocess["color"] == "BGR" else list(range(channels))
    weight = np.zeros((channels, channels, 1, 1), np.float32)
    for c, s in enumerate(source):
        weight[c, s, 0, 0] = preprocess["scale"] / std[c]
    return weight, (-mean / std).astype(np.float32)


def _the_photo_input(model: onnx.ModelProto, channels: int) -> onnx.ValueInfoProto:
    initializers = {t.name for t in model.graph.initializer}
    inputs = [v for v in model.graph.input if v.name not in initializers]
    if len(inputs) != 1:
        raise UserError(f"fuse_preprocess: the model has {len(inputs)} inputs; it folds one photo input")
    value = inputs[0]
    shape = dims(value)
    if value.type.tensor_type.elem_type != TensorProto.FLOAT or len(shape) != 4 or shape[1] != channels:
        raise UserError(
            f"fuse_preprocess: input '{value.name}' is {shape}, not a float [N, {channels}, H, W] photo "
            "(NCHW with the preprocessing's channels)"
        )
    return value


def _fold_into_readers(graph: onnx.GraphProto, photo: str, weight: np.ndarray, bias: np.ndarray) -> bool:
    """Fold the head into the convolutions that read the photo when that is exact (module
    docstring); False, and the graph untouched, when it is not."""
    readers = [n for n in graph.node if photo in n.input]
    constants = {t.name: t for t in graph.initializer}
    uses: dict[str, int] = {}
    for node in graph.node:
        for name in node.input:
            uses[name] = uses.get(name, 0) + 1
    folds = []
    for node in readers:
        attrs = node_attributes(node)
        pads = attrs.get("pads", [0])
        auto_pad = attrs.get("auto_pad", b"NOTSET")
        padded = any(pads) or auto_pad not in (b"NOTSET", b"VALID")
        if (
            node.op_type != "Conv"
            or list(node.input[:1]) != [photo]
            or attrs.get("group", 1) != 1
            or len(node.input) < 2
            or node.input[1] not in constants
            or uses[node.input[1]] != 1
            or (
                len(node.input) > 2
                and node.input[2]
                and (node.input[2] not in constants or uses[node.input[2]] != 1)
            )
            or (padded and np.any(bias != 0))
        ):
            return False
        w = numpy_helper.to_array(constants[node.input[1]]).astype(np.float64)
        if w.ndim != 4 or w.shape[1] != weight.shape[0]:
            return False
        folds.append((node, w))
    for node, w in folds:
        folded = np.einsum("okhw,kc->ochw", w, weight[:, :, 0, 0].astype(np.float64))
        b = numpy_helper.to_array(constants[node.input[2]]) if len(node.input) > 2 and node.input[2] else 0.0
        shifted = b + np.einsum("okhw,k->o", w, bias.astype(np.float64))
        constants[node.input[1]].CopyFrom(numpy_helper.from_array(folded.astype(np.float32), node.input[1]))
        bias_name = (
            node.input[2] if len(node.input) > 2 and node.input[2] else f"{node.input[1]}.{FUSED_HEAD}_bias"
        )
        if bias_name in constants:
            constants[bias_name].CopyFrom(numpy_helper.from_array(shifted.astype(np.float32), bias_name))
        else:
            graph.initializer.append(numpy_helper.from_array(shifted.astype(np.float32), bias_name))
            node.input[:] = [*node.input[:2], bias_name]
    return True


def fuse(model: onnx.ModelProto, preprocess: dict) -> onnx.ModelProto:
    if preprocess["layout"] != "NCHW":
        raise UserError("fuse_preprocess: the data set's layout is NHWC; the fused head takes NCHW photos")
    channels = 1 if preprocess["color"] == "GRAY" else 3
    fused = onnx.ModelProto()
    fused.CopyFrom(model)
    graph = fused.graph
    photo = _the_photo_input(fused, channels).name
    weight, bias = head_weights(preprocess, channels)
    for output in graph.output:
        if output.name == photo:
            raise UserError(f"fuse_preprocess: input '{photo}' is also an output of the model")
    if _fold_into_readers(graph, photo, weight, bias):
        return fused
    normalised = f"{photo}.{FUSED_HEAD}"
    for node in graph.node:
        node.input[:] = [normalised if i == photo else i for i in node.input]
    names = (f"{FUSED_HEAD}.weight", f"{FUSED_HEAD}.bias")
    graph.initializer.extend(numpy_helper.from_array(a, n) for a, n in zip((weight, bias), names))
    head = helper.make_node("Conv", [photo, *names], [normalised], name=FUSED_HEAD, kernel_shape=[1, 1])
    graph.node.insert(0, head)
    return fused


def run(params: dict, inputs: dict[str, Path], outdir: Path) -> dict[str, Path]:
    model = load_model(inputs["model"], "the imported model")
    return {"model": save_model(fuse(model, params["preprocess"]), outdir / "fused.onnx")}
