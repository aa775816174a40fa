"""Squares and sums of squares (an energy, a spectrum's power re^2 + im^2) get 16-bit grids
(`quantize = {"square_bits": 16}`, the default; docs/quantization.md, "Squares").

Squaring doubles a signal's range in decibels: the int8 grid that holds x at 40 dB holds x^2 at
about 20, its few large values setting the range and its many small ones rounding to a handful
of codes. Silero VAD's STFT power: 18 and 19 dB from calibration, the magnitude after its Sqrt
14 dB, and the encoder after it never recovered. A sum of squares is as wide as its terms, else
the narrowing after the sum throws away what the squares' width kept.
"""

from __future__ import annotations

import numpy as np
import onnx


def is_square(node: onnx.NodeProto | None, constants: dict) -> bool:
    """x^2: a Pow whose exponent is the constant 2."""
    if node is None or node.op_type != "Pow" or len(node.input) < 2:
        return False
    exponent = constants.get(node.input[1])
    return exponent is not None and np.size(exponent) == 1 and float(np.ravel(exponent)[0]) == 2.0


def wide_by_content(node: onnx.NodeProto, info, params: dict) -> bool:
    """A square, or an Add/Sub whose every non-constant term is a square already on a 16-bit grid
    (`info`: the planner's GraphInfo; `params`: the grids planned so far)."""
    if is_square(node, info.constants):
        return True
    if node.op_type not in ("Add", "Sub"):
        return False
    terms = [i for i in node.input if i not in info.constants]
    return bool(terms) and all(
        is_square(info.producers.get(i), info.constants) and params[i].bits == 16 for i in terms
    )
