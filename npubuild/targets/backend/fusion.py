"""Fusion: activations that run in their convolution's output path instead of as ops of their own."""

from __future__ import annotations

from dataclasses import dataclass, field

from npubuild.intmodel.program import IntegerModel


@dataclass(frozen=True)
class Fusion:
    """`activation[i] = j`: op j (a LUT) is applied by convolution i as it stores its result;
    `fused_away` are the convolution results that so never exist outside the MAC array."""

    activation: dict[int, int] = field(default_factory=dict)
    fused_away: frozenset[str] = frozenset()

    @property
    def absorbed(self) -> frozenset[int]:
        """The ops that emit nothing of their own."""
        return frozenset(self.activation.values())


# The largest table a convolution's output path holds: an int8 result's 256 entries, or an entry
# per 64 codes of an int16 one (the fine pre-activation grid, docs/quantization.md).
OUTPUT_PATH_TABLE_ENTRIES = 4096


def fuse(program: IntegerModel, plan: dict) -> Fusion:
    """A LUT activation whose only input is a 2-D convolution's result, read by nothing else,
    runs in that convolution's output path when its table fits there: one op, no intermediate
    tensor."""
    ops, tensors = program.ops, program.tensors
    device = {i: sg["device"] for sg in plan["subgraphs"] for i in sg["ops"]}
    group = {i: k for k, sg in enumerate(plan["subgraphs"]) for i in sg["ops"]}
    readers: dict[str, list[int]] = {}
    for i, op in enumerate(ops):
        for n in op.inputs:
            readers.setdefault(n, []).append(i)
    outputs = set(program.outputs)
    activation: dict[int, int] = {}
    fused_away: set[str] = set()
    for i, op in enumerate(ops):
        if op.kind != "conv" or op.attrs.transpose or device.get(i) != "npu":
            continue
        y = op.outputs[0]
        users = readers.get(y, [])
        if len(users) != 1 or y in outputs:
            continue
        (j,) = users
        lut = ops[j]
        if lut.kind != "lut" or 2 ** (tensors[y].bits - lut.attrs.index_shift) > OUTPUT_PATH_TABLE_ENTRIES:
            continue
        if device.get(j) == "npu" and group.get(j) == group.get(i):
            activation[i] = j
            fused_away.add(y)
    return Fusion(activation, frozenset(fused_away))
