"""Windows read through: a step-1 Slice along one axis that is not a contiguous piece of its input
(rows [a, b) of a [1, C, H, W] map: C runs of (b - a) x W bytes) is still one strided box of it,
its input's element strides from the element the window starts at. Where every reader of the
window loads it as boxes (element-wise adds and muls, lookup tables, clamps, and convolutions'
inputs), the Slice moves nothing: allocation.py makes its output a view at that offset, and each
reader's loads take the input's strides (`OpContext.strides`). The stripes' slices
(stripes.py: a chain that starts with a batch-norm's scale reads its rows of the chain's input)
are what this is for: each was a DRAM round trip of its rows."""

from __future__ import annotations

from npubuild.intmodel.program import IntegerModel, Op, is_maxpool
from npubuild.targets.backend.fusion import Fusion
from npubuild.targets.backend.memory import esize, four, row_major
from npubuild.targets.support import slice_steps

# the kinds whose emitters load their data inputs and store their result as boxes addressed with
# OpContext.strides (and max pools: `addresses_by_strides`)
STRIDED_KINDS = ("add", "mul", "lut", "clamp", "conv", "avgpool")


def slice_cut(op: Op, arrays: dict, shape: list[int]) -> tuple[int, int, int] | None:
    """(axis, first, end) of a step-1 Slice along one axis of a tensor of `shape`, or None."""
    consts = op.operand_arrays(arrays)
    if len(consts) < 2 or consts[0] is None or consts[1] is None or len(consts[0]) != 1:
        return None
    axes = consts[2] if len(consts) > 2 and consts[2] is not None else [0]
    if any(step != 1 for step in slice_steps(op, arrays)):
        return None
    axis = int(axes[0]) % len(shape)
    first, end, _ = slice(int(consts[0][0]), int(consts[1][0]), 1).indices(shape[axis])
    return axis, first, end


def row_windows(
    program: IntegerModel, shapes: dict, arrays: dict, plan: dict, fusion: Fusion
) -> dict[int, tuple[int, list[int]]]:
    """{Slice op index: (byte offset of its first element in the tensor it is a window of, that
    tensor's 4-D element strides)} for the Slices on the NPU whose outputs are read through: by
    box readers, or by Slices read through in turn (a window of a window: Silero VAD's STFT
    takes channels, then columns, of its convolution's result), whose offsets and strides are then
    those of the first Slice's input."""
    npu = {i for sg in plan["subgraphs"] if sg["device"] == "npu" for i in sg["ops"]}
    readers = program.readers()
    outputs, tensors = set(program.outputs), program.tensors
    cuts: dict[int, tuple[int, int, list[int]]] = {}  # Slice -> (axis, first, its input's shape)
    for i in sorted(npu):
        op = program.ops[i]
        if op.kind != "move" or op.op_type != "Slice" or len(op.outputs) != 1:
            continue
        x, y = op.inputs[0], op.outputs[0]
        if x in fusion.fused_away or x not in tensors or y in outputs or tensors.get(y) != tensors[x]:
            continue
        shape = [int(d) for d in shapes[x]]
        cut = slice_cut(op, arrays, shape)
        if cut is not None and len(shape) <= 4 and readers.get(y) and all(j in npu for j in readers[y]):
            cuts[i] = (cut[0], cut[1], shape)
    # a Slice read by Slices is a window only where those are too: drop until nothing changes
    windowed = set(cuts)
    changed = True
    while changed:
        changed = False
        for i in sorted(windowed):
            y = program.ops[i].outputs[0]
            if not all(reads_boxes(program.ops[j], y) or j in windowed for j in readers[y]):
                windowed.discard(i)
                changed = True
    by_output = {program.ops[i].outputs[0]: i for i in windowed}
    found: dict[int, tuple[int, list[int]]] = {}
    for i in sorted(windowed):  # program order: a window's window comes after it
        x = program.ops[i].inputs[0]
        axis, first, shape = cuts[i]
        outer = found.get(by_output.get(x, -1))
        strides = outer[1] if outer else row_major(four(shape))
        found[i] = (first * strides[axis + 4 - len(shape)] * esize(tensors[x].bits), strides)
    return found


def addresses_by_strides(op: Op) -> bool:
    """Whether `op`'s emitter loads its data inputs and stores its result as boxes addressed with
    OpContext.strides (so they may be windows of larger tensors): element-wise adds and muls,
    tables, clamps, convolutions and pools."""
    return op.kind in STRIDED_KINDS or is_maxpool(op)


def reads_boxes(op: Op, name: str) -> bool:
    """Whether `op` loads `name` only as boxes its emitter addresses with OpContext.strides: an
    element-wise add or mul (either operand), a table or clamp, a pool, or a convolution's input."""
    if not addresses_by_strides(op):
        return False
    if op.kind == "conv":
        return op.inputs[0] == name and name not in op.inputs[1:]
    return True
