"""Channel shuffles read through (ShuffleNet's): a Reshape of an NCHW map [1, C, H, W] to
[1, g, C/g, H*W], a Transpose swapping the two channel factors and a Reshape back permute the
channels, channel a*g + b of the result being channel b*C/g + a of the input. A tile of the result
holding whole runs of g channels is then one strided box of the input: [cin/g, g, rows, cols] with
strides [H*W, C/g*H*W, W, 1], which lands in SRAM as the shuffled channels. Where every reader of
the result is a convolution that loads such tiles (`reads_whole_runs`), the Transpose moves nothing
(allocation.py makes its output an alias of its input) and each reader's input load takes that box
(emit_mac.conv; schedule.conv keeps a depthwise reader's channel chunks whole runs of g)."""

from __future__ import annotations

from npubuild.intmodel.ops import ALIASES
from npubuild.intmodel.program import IntegerModel, Op


def channel_shuffles(program: IntegerModel, shapes: dict, plan: dict) -> dict[int, dict[str, int]]:
    """{Transpose op index: {each tensor that is its shuffled result (the Transpose's output and
    the Reshapes of it): g}} for the shuffles on the NPU whose every reader reads whole runs."""
    npu = {i for sg in plan["subgraphs"] if sg["device"] == "npu" for i in sg["ops"]}
    readers = program.readers()
    outputs = set(program.outputs)
    found: dict[int, dict[str, int]] = {}
    for i in sorted(npu):
        op = program.ops[i]
        g = _shuffle_groups(op, shapes)
        if g is None or op.inputs[0] in outputs:
            continue
        names, frontier, ok = {}, [op.outputs[0]], True
        while frontier and ok:
            name = frontier.pop()
            names[name] = g
            ok = name not in outputs and bool(readers.get(name))
            for j in readers.get(name, []):
                reader = program.ops[j]
                if j not in npu:
                    ok = False
                elif reader.kind == "move" and reader.op_type in ALIASES:
                    frontier.append(reader.outputs[0])
                elif not reads_whole_runs(reader, name, shapes, g):
                    ok = False
        if ok:
            found[i] = names
    return found


def _shuffle_groups(op: Op, shapes: dict) -> int | None:
    """g, where the op is the Transpose of a [1, g, C/g, H*W] tensor to [1, C/g, g, H*W]."""
    if op.kind != "move" or op.op_type != "Transpose" or list(op.attrs.get("perm") or []) != [0, 2, 1, 3]:
        return None
    shape = [int(d) for d in shapes.get(op.inputs[0], [])]
    if len(shape) != 4 or shape[0] != 1 or min(shape) < 1 or shape[1] == 1 or shape[2] == 1:
        return None
    return shape[1]


def reads_whole_runs(op: Op, name: str, shapes: dict, g: int) -> bool:
    """Whether a reader of a shuffled NCHW tensor loads it in tiles of whole runs of g channels: a
    convolution (not transposed) reading it as its input, of one group, of groups whose input
    channels are whole runs, or depthwise with one output channel per group (its channel chunks
    are then kept to whole runs, schedule.conv)."""
    if op.kind != "conv" or op.attrs.transpose or op.inputs[0] != name or name in op.inputs[1:]:
        return False
    shape = [int(d) for d in shapes.get(name, [])]
    out = [int(d) for d in shapes.get(op.outputs[0], [])]
    if len(shape) != 4 or len(out) != 4 or shape[1] % g:
        return False
    group, channels = op.attrs.group, shape[1]
    per_group_in = channels // group
    return group == 1 or per_group_in % g == 0 or (per_group_in == 1 and out[1] == group)
