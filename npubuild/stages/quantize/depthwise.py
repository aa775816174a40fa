"""Depthwise convolutions' inputs: which convolutions are depthwise, and the int8 grids per
channel a table's result can take for them (docs/quantization.md, "Per-channel depthwise inputs").
The planner decides which tensors take them; this module holds the arithmetic."""

from __future__ import annotations

import numpy as np
import onnx

from npubuild.stages.quantize.graphinfo import GraphInfo, attr

# A per-channel grid's coarsest channel is 2^CHANNEL_SHIFT_RANGE times its base (int16) grid, whose
# 32,767 codes 127 x 2^8 nearly spans: the lookup table that makes it holds 16-bit entries on the
# base grid, which each channel shifts right by its own amount.
CHANNEL_SHIFT_RANGE = 8


def is_depthwise(info: GraphInfo, node: onnx.NodeProto) -> bool:
    """A Conv of constant weights with one input channel per group and one output channel per
    input channel: output channel c reads input channel c alone."""
    weight = info.constants.get(node.input[1]) if len(node.input) > 1 else None
    return (
        node.op_type == "Conv"
        and weight is not None
        and weight.ndim == 4
        and attr(node, "group", 1) > 1
        and weight.shape[:2] == (attr(node, "group", 1), 1)
    )


def channel_shifts(absmax: np.ndarray, base_step: float, one_grid_step: float) -> tuple[int, ...] | None:
    """Each channel's power-of-two shift of the base grid: the finest multiple of `base_step` on
    which 127 steps hold the channel's calibrated peak (`absmax`). None where the grids per channel
    are not finer than the one asymmetric int8 grid of step `one_grid_step` on average (the
    geometric mean over the channels calibration saw): a symmetric grid per channel spends a
    code's sign on a channel that is mostly positive (a HardSwish's), so where the channels'
    ranges are alike the one grid is finer on most of them."""
    with np.errstate(divide="ignore"):
        shifts = np.ceil(np.log2(absmax / (127 * base_step)))
    shifts = np.clip(np.nan_to_num(shifts, nan=0.0, neginf=0.0), 0, CHANNEL_SHIFT_RANGE)
    seen = absmax > 0
    finer = np.log2(one_grid_step / (base_step * np.exp2(shifts[seen])))
    if not float(finer.mean()) > 0:
        return None
    return tuple(int(s) for s in shifts)
