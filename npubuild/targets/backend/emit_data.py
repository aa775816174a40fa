"""Tile commands of the ops that move data: Concat (requantizing inputs whose quantization
differs; nothing for an input its producer already wrote at its place), nearest Resize (row and
column indices as constants), and the copies of Transpose, Slice and Split (strided DMA reads of
the input, contiguous writes)."""

from __future__ import annotations

import math

import numpy as np

from npubuild.intmodel.program import Op
from npubuild.targets.backend.commands import Command, InTile, Step, Tile, load, store
from npubuild.targets.backend.context import OpContext
from npubuild.targets.backend.memory import align, esize, four, row_major, space
from npubuild.targets.backend.schedule import OpSchedule, boxes, resize_indices
from npubuild.targets.support import slice_steps


def concat(ctx: OpContext, op: Op, sched: OpSchedule) -> list[Command]:
    y = op.outputs[0]
    out4 = four(ctx.shapes[y])
    rank = len(ctx.shapes[y])
    axis = op.attrs.axis % rank + (4 - rank)
    offset = 0
    commands: list[Command] = []
    contiguous = all(d == 1 for d in out4[:axis])
    inner = int(math.prod(out4[axis + 1 :])) * esize(ctx.bits(y))
    for name, rescale, part in zip(op.inputs, op.attrs.rescale, sched.parts):
        addr, shape, bits = ctx.operand(op, name, ctx.bits(y))
        # written at its place by its producer (allocation.py), as a contiguous piece or a window
        placed = contiguous or ctx.windows.get(name) == row_major(out4)
        if placed and rescale.same and name not in op.constants and addr == ctx.addr[y] + offset * inner:
            offset += shape[axis]
            continue
        bufs = part.buffers(ctx.sram)
        for start, size in boxes(shape, list(part.extents)):
            n = int(math.prod(size))
            source = load(InTile(), addr, bits, size, row_major(shape), start)
            dst, compute = InTile(), None
            if not rescale.same:
                dst = InTile(align(n * esize(bits)))
                compute = Step(
                    "requant",
                    dict(
                        src=InTile(), n=n, in_bits=bits, in_zp=rescale.zin, m0=rescale.m0,
                        shift=rescale.shift, dst=dst, out_bits=ctx.bits(y), out_zp=ctx.zero_point(y),
                    ),
                )  # fmt: skip
            out_start = list(start)
            out_start[axis] += offset
            result = store(dst, ctx.addr[y], ctx.bits(y), size, row_major(out4), out_start)
            commands.append(Tile(bufs, [source], compute, result, frozenset({"compute", "load"})))
        offset += shape[axis]
    return commands


def resize_nearest(ctx: OpContext, op: Op, sched: OpSchedule) -> list[Command]:
    x, y = op.inputs[0], op.outputs[0]
    bits = ctx.bits(x)
    _, c, h, w = ctx.shapes[x]
    _, _, oh, ow = ctx.shapes[y]
    row_idx, col_idx = resize_indices(op, [h, w], [oh, ow])
    e = esize(bits)
    cb, rows = sched.extents
    bufs = sched.buffers(ctx.sram)
    xs, ys = row_major([1, c, h, w]), row_major([1, c, oh, ow])
    commands: list[Command] = []
    for r0 in range(0, oh, rows):
        r1 = min(r0 + rows, oh)
        lo, hi = int(row_idx[r0:r1].min()), int(row_idx[r0:r1].max())
        # per band: its rows' indices relative to the first input row it reads, then the columns'
        index = np.concatenate([row_idx[r0:r1] - lo, col_idx]).astype(np.int32)
        # keyed by the result: a layer's stripes (stripes.py) are ops of one node whose bands differ
        iaddr = ctx.consts.add(f"{y}#resize{r0}", index)
        for c0 in range(0, c, cb):
            c1 = min(c0 + cb, c)
            dst = InTile(align((c1 - c0) * (hi - lo + 1) * w * e))
            idx_at = InTile(dst.offset + align((c1 - c0) * (r1 - r0) * ow * e))
            loads = [
                load(InTile(), ctx.addr[x], bits, [1, c1 - c0, hi - lo + 1, w], xs, [0, c0, lo, 0]),
                load(idx_at, iaddr, 32, [1, 1, 1, index.size], [0, 0, 0, 1], [0, 0, 0, 0]),
            ]
            compute = Step(
                "resize",
                dict(
                    src=InTile(), c=c1 - c0, in_h=hi - lo + 1, in_w=w, bits=bits, index=idx_at,
                    dst=dst, out_h=r1 - r0, out_w=ow,
                ),
            )  # fmt: skip
            result = store(dst, ctx.addr[y], bits, [1, c1 - c0, r1 - r0, ow], ys, [0, c0, r0, 0])
            commands.append(Tile(bufs, loads, compute, result))
    return commands


def copy(ctx: OpContext, op: Op, sched: OpSchedule) -> list[Command]:
    """Transpose, Slice and Split: strided DMA reads of the input, contiguous writes."""
    x = op.inputs[0]
    in_shape = [int(d) for d in ctx.shapes[x]]
    rank = len(in_shape)
    in_strides = row_major(four(in_shape))[4 - rank :]
    kind = op.op_type
    if kind == "Transpose":
        perm = op.attrs.get("perm") or list(range(rank))[::-1]
        scattered = _scattered_store(ctx, x, op.outputs[0], perm, sched.parts[0])
        if scattered is not None:
            return scattered
        pieces = [(op.outputs[0], [in_strides[p] for p in perm], 0)]
    elif kind == "Slice":
        consts = op.operand_arrays(ctx.arrays)
        starts, ends = consts[0], consts[1]
        axes = consts[2] if len(consts) > 2 and consts[2] is not None else range(len(starts))
        steps = slice_steps(op, ctx.arrays)
        if len(steps) != len(starts):
            steps = [1] * len(starts)
        strides, origin = list(in_strides), 0
        for st, en, ax, sp in zip(starts, ends, axes, steps):
            ax = int(ax) % rank
            begin, _, step = slice(int(st), int(en), int(sp)).indices(in_shape[ax])
            strides[ax] = in_strides[ax] * step
            origin += begin * in_strides[ax]
        pieces = [(op.outputs[0], strides, origin)]
    else:  # Split
        axis = op.attrs.get("axis", 0) % rank
        pieces, origin = [], 0
        for out in op.outputs:
            pieces.append((out, list(in_strides), origin))
            origin += int(ctx.shapes[out][axis]) * in_strides[axis]
    commands: list[Command] = []
    for (y, src_strides, origin), part in zip(pieces, sched.parts):
        commands += _copy(ctx, x, y, src_strides, origin, part)
    return commands


def _scattered_store(
    ctx: OpContext, x: str, y: str, perm: list[int], part: OpSchedule
) -> list[Command] | None:
    """A Transpose of a whole resident tensor into DRAM as one store: the DMA reads the input
    where it lies, in its own order, and writes each element to its place in the output (the
    output's strides, permuted back onto the input's axes), with no copy through a tile buffer.
    None where that is not the case. (Silero VAD's last encoder result, [128, 16] to [16, 128]
    for its LSTM on the CPU: a 36-cycle copy before the store.)"""
    in_shape = [int(d) for d in ctx.shapes[x]]
    out4 = four(ctx.shapes[y])
    where, at = space(ctx.addr[x])
    if where != 1 or space(ctx.addr[y])[0] != 0 or list(part.extents) != list(out4):
        return None
    rank = len(in_shape)
    out_strides = row_major(out4)[4 - rank :]
    strides = [0] * (4 - rank) + [out_strides[perm.index(axis)] for axis in range(rank)]
    scatter = store(at, ctx.addr[y], ctx.bits(x), four(in_shape), strides, [0, 0, 0, 0])
    return [Tile(part.buffers(ctx.sram), [], None, scatter, frozenset())]


def _copy(
    ctx: OpContext, x: str, y: str, src_strides: list[int], origin: int, sched: OpSchedule
) -> list[Command]:
    bits = ctx.bits(x)
    out = four(ctx.shapes[y])
    src = [0] * (4 - len(src_strides)) + list(src_strides)
    bufs = sched.buffers(ctx.sram)
    commands: list[Command] = []
    for start, size in boxes(out, list(sched.extents)):
        source = load(InTile(), ctx.addr[x] + origin * esize(bits), bits, size, src, start)
        result = store(InTile(), ctx.addr[y], bits, size, row_major(out), start)
        commands.append(Tile(bufs, [source], None, result, frozenset({"load"})))
    return commands
