"""Requantization as ONNX nodes, for the exact QDQ export (qdq_exact.py): the fixed-point rule of
`intmodel/fixedpoint.requantize` (acc * M0 * 2^-(31 + shift), rounded half away from zero) on a
float64 tensor of integers, in float64 where every product stays below 2^52 and in int64 nodes
otherwise (with the 24-bit split of `fixedpoint._requantize_wide` for the widest). Each function
takes the export's `const(label, name, value, dtype)` and `named(base, part)`, so the nodes and
constants it makes are named as the export names everything else."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper

from npubuild.intmodel.fixedpoint import FLOAT64_EXACT_PRODUCT, WIDE_PRODUCT

_SPLIT = 24  # as fixedpoint._requantize_wide: |v| < 2^48 in two halves of 24 bits

Const = Callable[..., str]  # (label, name, value, dtype=float64) -> the initializer's name
Named = Callable[[str, str], str]  # (base, part) -> the made name


def rounding(const: Const, named: Named, label: str, value: str) -> list[onnx.NodeProto]:
    """float64 `value` rounded half away from zero, sign(v) * floor(|v| + 1/2): `LABEL__rounded`."""
    half = const(label, "one_half", 0.5)
    return [
        helper.make_node("Abs", [value], [named(label, "abs")]),
        helper.make_node("Add", [named(label, "abs"), half], [named(label, "biased")]),
        helper.make_node("Floor", [named(label, "biased")], [named(label, "magnitude")]),
        helper.make_node("Sign", [value], [named(label, "sign")]),
        helper.make_node(
            "Mul",
            [named(label, "magnitude"), named(label, "sign")],
            [named(label, "rounded")],
        ),
    ]


def requantization(
    const: Const,
    named: Named,
    label: str,
    bound: float,
    m0: np.ndarray,
    shift: np.ndarray,
    per_channel: tuple[int, ...],
) -> Callable[[str], list[onnx.NodeProto]] | None:
    """The nodes of `requantize` on a float64 value of integers below `bound` in magnitude
    (m0 and shift per channel, shaped `per_channel`), as a function of the value's name,
    writing float64 `LABEL__rounded`; None when no form here is exact for that bound."""
    m0, shift = np.asarray(m0, np.int64), np.asarray(shift, np.int64)
    total = 31 + shift
    left, right = np.maximum(-total, 0), np.maximum(total, 0)
    largest = bound * float((m0 << left).max(initial=0))
    if largest < FLOAT64_EXACT_PRODUCT:
        multiplier = const(label, "multiplier", np.ldexp(m0.astype(np.float64), -total).reshape(per_channel))

        def in_float64(value: str) -> list[onnx.NodeProto]:
            return [
                helper.make_node("Mul", [value, multiplier], [named(label, "scaled")]),
                *rounding(const, named, label, named(label, "scaled")),
            ]

        return in_float64
    wide = largest >= WIDE_PRODUCT
    if wide and not ((right >= _SPLIT).all() and bound < 2.0 ** (2 * _SPLIT)):
        return None
    half = np.where(right > 0, np.left_shift(np.int64(1), np.maximum(right - 1, 0)), 0)

    def channel(name: str, v: np.ndarray) -> str:
        return const(label, name, v.reshape(per_channel), np.int64)

    def part(name: str) -> str:
        return named(label, name)

    def step(op: str, inputs: list[str], result: str, **attrs) -> onnx.NodeProto:
        """One arithmetic step, its result named as the label's part `result`."""
        return helper.make_node(op, inputs, [part(result)], **attrs)

    def in_int64(value: str) -> list[onnx.NodeProto]:
        out = [step("Cast", [value], "v64", to=TensorProto.INT64), step("Abs", [part("v64")], "abs")]
        if not wide:  # (|v| M0 2^left + half) div 2^right
            out += [
                step("Mul", [part("abs"), channel("m0", m0 << left)], "product"),
                step("Add", [part("product"), channel("half", half)], "biased"),
                step("Div", [part("biased"), channel("divisor", 1 << right)], "magnitude"),
            ]
        else:  # (high M0 + ((low M0 + half) div 2^24)) div 2^(n - 24), every term below 2^63
            unit = const(label, "unit", 1 << _SPLIT, np.int64)
            multiplier = channel("m0", m0)
            out += [
                step("Div", [part("abs"), unit], "v_high"),
                step("Mul", [part("v_high"), unit], "v_high_part"),
                step("Sub", [part("abs"), part("v_high_part")], "v_low"),
                step("Mul", [part("v_low"), multiplier], "low_product"),
                step("Add", [part("low_product"), channel("half", half)], "low_biased"),
                step("Div", [part("low_biased"), unit], "carry"),
                step("Mul", [part("v_high"), multiplier], "high_product"),
                step("Add", [part("high_product"), part("carry")], "partial"),
                step("Div", [part("partial"), channel("divisor", 1 << (right - _SPLIT))], "magnitude"),
            ]
        return out + [
            step("Sign", [part("v64")], "sign"),
            step("Mul", [part("magnitude"), part("sign")], "rounded_64"),
            step("Cast", [part("rounded_64")], "rounded", to=TensorProto.DOUBLE),
        ]

    return in_int64
