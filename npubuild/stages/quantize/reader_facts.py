"""What the one op that reads a tensor tells the search for its range: how many of its values an
average pool takes the mean of, and which Softmax turns it into probabilities
(docs/quantization.md, "Ranged for the mean" and "A classifier's logits span "certain"")."""

from __future__ import annotations

import math

import numpy as np
import onnx

from npubuild.intmodel.ops import MOVE_OPS
from npubuild.stages.quantize.graphinfo import GraphInfo, attr


def sole_reader(info: GraphInfo, name: str) -> onnx.NodeProto | None:
    """The one op that reads `name`; None when several do or it is a network output (whose error
    counts as it is)."""
    readers = info.consumers.get(name, [])
    return readers[0] if len(readers) == 1 and name not in info.outputs else None


def averaged_count(info: GraphInfo, name: str) -> int:
    """How many of `name`'s values each output of the average pool that alone reads it takes the
    mean of; 1 for any other reader."""
    reader = sole_reader(info, name)
    if reader is not None and reader.op_type == "GlobalAveragePool" and len(info.shapes.get(name, [])) > 2:
        return int(np.prod(info.shapes[name][2:]))
    if reader is not None and reader.op_type == "AveragePool":
        return int(np.prod(attr(reader, "kernel_shape", [1])))
    return 1


def softmax_of(info: GraphInfo, name: str) -> onnx.NodeProto | None:
    """The Softmax that alone reads `name`, directly or through moves (a Flatten keeps the grid)."""
    reader = sole_reader(info, name)
    while reader is not None and reader.op_type in MOVE_OPS:
        reader = sole_reader(info, reader.output[0])
    return reader if reader is not None and reader.op_type == "Softmax" else None


def gap_to_zero(result_step: float) -> float:
    """The logit gap at which a Softmax's probability for a class falls below half its result
    grid's step, so the grid rounds it to zero: ln(2 / step). A logit grid spanning less cannot
    say "certain" (PP-OCR cls, calibrated on images it was unsure of, logits within +-3.2, capped
    its confident answers at 0.997)."""
    return math.log(2 / result_step)
