"""The NPU-support rules on their own: every constraint states its rule, and each decides what
the rule says on small hand-made ops."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from npubuild.intmodel.program import IntegerModel
from npubuild.targets.spec import BUILTIN_TARGETS
from npubuild.targets.support import INTEGER_FORM, NPU, OpView, integer_blocker, npu_blocker

SMALL, MEDIUM = BUILTIN_TARGETS["vnpu-s"], BUILTIN_TARGETS["vnpu-m"]


def test_every_constraint_states_its_rule():
    for constraint in [*INTEGER_FORM, *NPU]:
        assert constraint.__doc__ and len(constraint.__doc__.split()) >= 6, constraint.__name__


def _node(op_type, inputs, outputs=("y",), domain="", **attrs):
    node = SimpleNamespace(op_type=op_type, domain=domain, input=list(inputs), output=list(outputs))
    return node, (lambda name, default: attrs.get(name, default))


@pytest.mark.parametrize(
    "op_type, inputs, constants, attrs, reason",
    [
        ("Div", ["x", "d"], {}, {}, "Div by a tensor"),
        ("Div", ["x", "d"], {"d": np.float32(2)}, {}, ""),
        ("Conv", ["x", "w"], {}, {}, "Conv with a non-constant weight"),
        ("Gemm", ["x", "w"], {"w": np.zeros((2, 2))}, {"alpha": 0.5}, "Gemm with transA/alpha/beta"),
        ("MatMul", ["x", "w"], {"w": np.zeros((2, 2, 2))}, {}, "MatMul with a weight that is not 2-D"),
        ("Resize", ["x", "", "s"], {"s": np.ones(4)}, {"mode": "linear"}, "Resize mode linear"),
        ("Add", ["a", "b"], {"a": np.ones(1), "b": np.ones(1)}, {}, "all inputs constant"),
        ("Einsum", ["a", "b"], {}, {}, "no integer rule for Einsum"),
        ("AveragePool", ["x"], {}, {"auto_pad": "SAME_UPPER"}, "AveragePool with SAME padding or dilations"),
    ],
)
def test_integer_form(op_type, inputs, constants, attrs, reason):
    node, attr = _node(op_type, inputs, **attrs)
    assert integer_blocker(node, attr, constants) == reason


def _program(ops: list[dict], bits: dict[str, int]) -> IntegerModel:
    tensors = {n: {"scale": 0.1, "zero_point": 0, "bits": b} for n, b in bits.items()}
    return IntegerModel.model_validate({"ops": ops, "tensors": tensors, "outputs": ["y"]})


CONV_ATTRS = {
    "strides": [1, 1],
    "pads": [1, 1, 1, 1],
    "dilations": [1, 1],
    "group": 1,
    "min": -128,
    "max": 127,
}
MAC_ARRAYS = {"weight": "w", "bias": "b", "m0": "m", "shift": "s", "weight_scale": "ws"}


def _conv(batch: int, bits: int = 8):
    op = {
        "kind": "conv",
        "op_type": "Conv",
        "inputs": ["x"],
        "outputs": ["y"],
        "attrs": {**CONV_ATTRS, "transpose": False},
        "arrays": MAC_ARRAYS,
    }
    program = _program([op], {"x": bits, "y": 8})
    shapes = {"x": [batch, 3, 8, 8], "y": [batch, 4, 8, 8], "w": [4, 3, 3, 3]}
    return program.ops[0], program, shapes


def test_npu_constraints():
    op, program, shapes = _conv(1)
    assert npu_blocker(OpView(op, program, {}, shapes, SMALL)) is None
    op, program, shapes = _conv(2)
    assert npu_blocker(OpView(op, program, {}, shapes, SMALL)) == "convolutions with batch > 1"
    op, program, shapes = _conv(1, bits=16)
    narrow = SMALL.model_copy(update={"activation_dtypes": ("int8",)})
    assert npu_blocker(OpView(op, program, {}, shapes, narrow)) == "vnpu-s has no int16 activations"
    op, program, shapes = _conv(1)
    reason = npu_blocker(OpView(op, program, {}, shapes, SMALL, fits=lambda _: False))
    assert reason == "does not fit vnpu-s's 256 KiB SRAM even in the smallest tile"
    resize = {
        "kind": "resize_nearest",
        "op_type": "Resize",
        "inputs": ["x"],
        "outputs": ["y"],
        "attrs": {"out_shape": [1, 3, 8, 8]},
    }
    floating = {"kind": "float", "op_type": "Softmax", "inputs": ["x"], "outputs": ["y"], "proto": "p"}
    program = _program([resize, floating], {"x": 8, "y": 8})
    conv = {**floating, "op_type": "Conv", "node": "c"}
    why = {"node": "c", "op_type": "Conv", "reason": "Conv with a non-constant weight"}
    with_reason = IntegerModel.model_validate({**program.model_dump(), "ops": [conv], "float_nodes": [why]})
    assert (
        npu_blocker(OpView(with_reason.ops[0], with_reason, {}, shapes, MEDIUM))
        == "Conv stays float: Conv with a non-constant weight"
    )
    resize, floating = program.ops
    shapes = {"x": [1, 3, 4, 4], "y": [1, 3, 8, 8]}
    without = SMALL.model_copy(
        update={"supported_ops": tuple(o for o in SMALL.supported_ops if o != "Resize")}
    )
    assert npu_blocker(OpView(resize, program, {}, shapes, without)) == "vnpu-s does not support Resize"
    assert npu_blocker(OpView(resize, program, {}, shapes, SMALL)) is None
    assert npu_blocker(OpView(resize, program, {}, shapes, MEDIUM)) is None
    assert (
        npu_blocker(OpView(floating, program, {}, shapes, MEDIUM))
        == "Softmax has no integer form (it stays float)"
    )


def test_reshape_like_ops_need_nothing_of_the_target():
    squeeze = {"kind": "move", "op_type": "Squeeze", "inputs": ["x"], "outputs": ["y"], "constants": {}}
    program = _program([squeeze], {"x": 8, "y": 8})
    shapes = {"x": [1, 3, 1, 4], "y": [1, 3, 4]}
    assert "Squeeze" not in MEDIUM.supported_ops
    assert npu_blocker(OpView(program.ops[0], program, {}, shapes, MEDIUM)) is None
