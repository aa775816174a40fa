"""Fusion: activations, and residual Adds after them (and ReLUs after those), that run in their
convolution's output path instead of as ops of their own; ReLUs (clamps) that run in an add's or
a mul's."""

from __future__ import annotations

from dataclasses import dataclass, field

from npubuild.intmodel.program import IntegerModel, Op


@dataclass(frozen=True)
class Fusion:
    """`activation[i] = j`: op j (a LUT) is applied by convolution i as it stores its result;
    `fused_away` are the convolution results that so never exist outside the MAC array."""

    activation: dict[int, int] = field(default_factory=dict)
    fused_away: frozenset[str] = frozenset()
    # `residual[i] = j`: op j (an Add) adds a tensor computed before convolution i to its result
    # (after its activation) as the convolution stores it, or adds one of mul i's operands to its
    # product in the same vector pass
    residual: dict[int, int] = field(default_factory=dict)
    # `clamp[i] = j`: op j (a clamp: ReLU, Clip) clamps what add or mul i writes (format 5.0), or
    # the sum of conv i's residual Add (format 7.0)
    clamp: dict[int, int] = field(default_factory=dict)

    @property
    def absorbed(self) -> frozenset[int]:
        """The ops that emit nothing of their own."""
        return (
            frozenset(self.activation.values())
            | frozenset(self.residual.values())
            | frozenset(self.clamp.values())
        )

    def written(self, i: int, ops: list) -> list[str]:
        """What op i stores: its result, or its fused activation's, residual Add's or clamp's."""
        if i in self.clamp:
            return ops[self.clamp[i]].outputs
        if i in self.residual:
            return ops[self.residual[i]].outputs
        if i in self.activation:
            return ops[self.activation[i]].outputs
        return ops[i].outputs

    def read(self, i: int, ops: list) -> list[str]:
        """What op i reads: its inputs, and its fused residual Add's (the tensor added)."""
        return [*ops[i].inputs, *(ops[self.residual[i]].inputs if i in self.residual else [])]


# The largest table a convolution's output path holds: an int8 result's 256 entries, or an entry
# per 64 codes of an int16 one (the fine pre-activation grid, docs/quantization.md).
OUTPUT_PATH_TABLE_ENTRIES = 4096


def fuse(program: IntegerModel, plan: dict, shapes: dict | None = None) -> Fusion:
    """A LUT activation whose only input is a 2-D convolution's result, read by nothing else,
    runs in that convolution's output path when its table fits there: one op, no intermediate
    tensor. Then (given `shapes`) an Add whose one input is that result (activated or not), read
    by nothing else, and whose other input has the same shape and is made before the convolution
    runs (a residual connection) runs there too (`_residual`)."""
    ops, tensors = program.ops, program.tensors
    device = {i: sg["device"] for sg in plan["subgraphs"] for i in sg["ops"]}
    group = {i: k for k, sg in enumerate(plan["subgraphs"]) for i in sg["ops"]}
    readers = program.readers()
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
    residual: dict[int, int] = {}
    if shapes is not None:
        position = {i: k for sg in plan["subgraphs"] for k, i in enumerate(sg["ops"])}
        producer = {n: i for i, op in enumerate(ops) for n in op.outputs if n}
        for i, op in enumerate(ops):
            if op.kind != "conv" or op.attrs.transpose or device.get(i) != "npu":
                continue
            result = ops[activation[i]].outputs[0] if i in activation else op.outputs[0]
            j = _residual(ops, readers, outputs, shapes, result)
            if j is None or device.get(j) != "npu" or group.get(j) != group.get(i):
                continue
            other = other_term(ops[j], result)
            made = producer.get(other)
            if made is not None and group.get(made) == group.get(i) and position[made] > position[i]:
                continue  # made after the convolution: not there when its output path needs it
            residual[i] = j
            fused_away.add(result)
        for i, op in enumerate(ops):  # x + x * g (a squeeze-excite block's shortcut): one vector pass
            if op.kind != "mul" or device.get(i) != "npu":
                continue
            j = _residual(ops, readers, outputs, shapes, op.outputs[0])
            if j is None or j in residual.values() or device.get(j) != "npu" or group.get(j) != group.get(i):
                continue
            other = other_term(ops[j], op.outputs[0])
            if other in op.inputs and other not in op.constants:
                residual[i] = j
                fused_away.add(op.outputs[0])
    clamp: dict[int, int] = {}
    for i, op in enumerate(ops):
        # Add/Mul -> ReLU (DenseNet's batch norms before each conv); conv -> residual Add -> ReLU
        # (ResNet's, ShuffleNet's blocks; format 7.0)
        fusible = op.kind in ("add", "mul") or (op.kind == "conv" and i in residual)
        if not fusible or device.get(i) != "npu" or i in residual.values():
            continue
        result = ops[residual[i]].outputs[0] if i in residual else op.outputs[0]
        users = readers.get(result, [])
        if len(users) != 1 or result in outputs:
            continue
        (j,) = users
        clip = ops[j]
        if clip.kind != "clamp" or device.get(j) != "npu" or group.get(j) != group.get(i):
            continue
        written, clamped = tensors.get(result), tensors.get(clip.outputs[0])
        if written is not None and clamped is not None and written.bits == clamped.bits:
            clamp[i] = j
            fused_away.add(result)
    return Fusion(activation, frozenset(fused_away), residual, clamp)


def other_term(add: Op, term: str) -> str:
    """The input of a fused residual Add that is not `term` (the result of the op it runs in)."""
    return next(n for n in add.inputs if n != term)


def _residual(ops: list, readers: dict, outputs: set, shapes: dict, result: str) -> int | None:
    """The Add that is the only reader of a convolution's `result` and adds a non-constant tensor
    of the same shape (no broadcast) to it, if there is one."""
    users = readers.get(result, [])
    if len(users) != 1 or result in outputs:
        return None
    (j,) = users
    add = ops[j]
    if add.kind != "add" or len(add.inputs) != 2 or add.inputs[0] == add.inputs[1]:
        return None
    other = other_term(add, result)
    shape = shapes.get(result)
    if (
        other in add.constants
        or shape is None
        or shapes.get(other) != shape
        or shapes.get(add.outputs[0]) != shape
    ):
        return None
    return j
