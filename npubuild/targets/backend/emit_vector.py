"""Tile commands of the vector engine's ops: element-wise Add and Mul (with broadcasting),
lookup tables, clamps, global average and max/average pooling."""

from __future__ import annotations

import math

import numpy as np

from npubuild.intmodel.codes import qrange
from npubuild.intmodel.program import Op
from npubuild.targets.backend.commands import (
    Command,
    ConstLoads,
    InConst,
    InTile,
    Step,
    Tile,
    const_load,
    load,
    store,
)
from npubuild.targets.backend.context import OpContext
from npubuild.targets.backend.fusion import other_term
from npubuild.targets.backend.memory import align, esize, four, row_major
from npubuild.targets.backend.schedule import (
    OpSchedule,
    boxes,
    broadcast_box,
    pool_geometry,
    window,
)
from npubuild.targets.isa import NO_PADS, NO_RESIDUAL, OUTPUT_CLAMP, SUM_OPERANDS


def binary(
    ctx: OpContext, op: Op, sched: OpSchedule, residual: Op | None = None, clamp: Op | None = None
) -> list[Command]:
    y = op.outputs[0]
    z = residual.outputs[0] if residual else y  # what is stored: a chained residual Add's sum, or y
    # a fused clamp keeps z's codes and grid, and names what is stored
    bounds = (
        {"min": clamp.attrs.min, "max": clamp.attrs.max}
        if clamp
        else dict(zip(OUTPUT_CLAMP, qrange(ctx.bits(z))))
    )
    z = clamp.outputs[0] if clamp else z
    out4 = four(ctx.shapes[y])
    operands = [(name, *ctx.operand(op, name, ctx.bits(y))) for name in op.inputs]
    bufs = sched.buffers(ctx.sram)
    at = op.attrs
    commands: list[Command] = []
    for start, size in boxes(out4, list(sched.extents)):
        offset, loads, places = 0, [], []
        for name, addr, shape, bits in operands:
            box = broadcast_box(shape, size)
            first = [st if d != 1 else 0 for st, d in zip(start, shape)]
            strides = row_major(shape) if name in op.constants else ctx.strides(name)
            if name in ctx.upsampled:
                loads.append(_upsampled(ctx, name, InTile(offset), start, size))
            else:
                loads.append(load(InTile(offset), addr, bits, box, strides, first))
            places.append((InTile(offset), box, bits))
            offset += align(int(math.prod(box)) * esize(bits))
        (pa, ba, bita), (pb, bb, bitb) = places
        args = dict(
            a=pa, a0=ba[0], a1=ba[1], a2=ba[2], a3=ba[3], a_bits=bita,
            b=pb, b0=bb[0], b1=bb[1], b2=bb[2], b3=bb[3], b_bits=bitb,
            dst=InTile(offset), o0=size[0], o1=size[1], o2=size[2], o3=size[3], out_bits=ctx.bits(y),
            za=at.za, zb=at.zb, out_zp=ctx.zero_point(y),
        )  # fmt: skip
        if op.kind == "add":
            args.update(ma=at.ma, mb=at.mb, **bounds)
        else:
            args.update(m0=at.m0, shift=at.shift, **_chained_add(ctx, op, residual), **bounds)
        result = store(InTile(offset), ctx.addr[z], ctx.bits(z), size, ctx.strides(z), start)
        commands.append(Tile(bufs, loads, Step(op.kind, args), result))
    return commands


def _upsampled(ctx: OpContext, name: str, sram: InTile, start: list[int], size: list[int]) -> Step:
    """The load of a tile of whole maps of an upsample read through (upsamples.py): the input's
    channels with each row `fh` times and each element `fw` times, densely."""
    source, fh, fw = ctx.upsampled[name]
    _, _, h, w = four(ctx.shapes[source])
    if size[0] != 1 or start[2:] != [0, 0] or size[2:] != [h * fh, w * fw]:
        raise ValueError(f"a tile of {name} that is not whole maps: {start} + {size}")
    dims, strides = [size[1] * h, fh, w, fw], [w, 0, 1, 0]  # (channel, row), repeat, column, repeat
    return load(sram, ctx.addr[source], ctx.bits(source), dims, strides, [start[1] * h, 0, 0, 0])


def _chained_add(ctx: OpContext, op: Op, residual: Op | None) -> dict:
    """A mul instruction's chained residual Add operands: which of its operands the Add adds to
    the product, and the Add's parameters with the product as the first term."""
    if residual is None:
        return {k: NO_RESIDUAL[k] for k in ("then_add", "add_term", *SUM_OPERANDS)}
    product = op.outputs[0]
    term = other_term(residual, product)
    return {"then_add": 1, "add_term": op.inputs.index(term), **ctx.sum_operands(residual, product)}


def unary(
    ctx: OpContext, op: Op, sched: OpSchedule, instruction: str, per_tile=None, **operands
) -> list[Command]:
    """Tiles of an element-wise op of one input: `instruction` with `operands` besides the source,
    count and destination, and those `per_tile(start, size)` gives for each tile's box."""
    x, y = op.inputs[0], op.outputs[0]
    shape = four(ctx.shapes[y])
    bufs = sched.buffers(ctx.sram)
    strides = ctx.strides(y)  # (a piece of a Concat written at its place: allocation.py)
    commands: list[Command] = []
    for start, size in boxes(shape, list(sched.extents)):
        n = int(math.prod(size))
        dst = InTile(align(n * esize(ctx.bits(x))))
        tiled = per_tile(start, size) if per_tile else {}
        compute = Step(instruction, dict(src=InTile(), n=n, **operands, dst=dst, **tiled))
        source = load(InTile(), ctx.addr[x], ctx.bits(x), size, ctx.strides(x), start)
        commands.append(
            Tile(bufs, [source], compute, store(dst, ctx.addr[y], ctx.bits(y), size, strides, start))
        )
    return commands


def lut(ctx: OpContext, op: Op, sched: OpSchedule) -> list[Command]:
    x, y = op.inputs[0], op.outputs[0]
    taddr, table_bytes, shifts_at = ctx.table(op)
    # a pinned table (pinning.py) loads to its own SRAM address, where the instruction reads it
    pinned = ctx.pinned.get(ctx.table_key(op))
    table = InConst(0) if pinned is None else pinned
    operands = dict(
        in_bits=ctx.bits(x),
        table=table,
        offset=op.attrs.offset,
        out_bits=ctx.bits(y),
        shift=op.attrs.index_shift,
    )

    def channel_shifts(start: list[int], size: list[int]) -> dict:
        """A per-channel result's shifts: from the tile's first channel, one per h x w run."""
        if shifts_at < 0:
            return {"shifts": -1, "per": 0}
        if size[0] != 1:
            raise ValueError("a per-channel table's tile spans several images")
        at = shifts_at + start[1]
        return {"shifts": InConst(at) if pinned is None else pinned + at, "per": size[2] * size[3]}

    tiles = unary(ctx, op, sched, "lut", per_tile=channel_shifts, **operands)
    loads = [const_load(0, taddr, table_bytes, pinned_at=pinned)]
    return [ConstLoads(loads), *tiles]


def clamp(ctx: OpContext, op: Op, sched: OpSchedule) -> list[Command]:
    at = op.attrs
    return unary(ctx, op, sched, "clamp", bits=ctx.bits(op.inputs[0]), min=at.min, max=at.max)


def global_avgpool(ctx: OpContext, op: Op, sched: OpSchedule) -> list[Command]:
    x, y = op.inputs[0], op.outputs[0]
    _, c, h, w = ctx.shapes[x]
    cb, rows = sched.extents
    bufs = sched.buffers(ctx.sram)
    acc = ctx.sram.scratch_base()  # int64 accumulators
    # the means go into the tile's own buffer after its rows: a tile of whole channels stores
    # them while the next tile computes (in one scratch place its compute overwrote them first)
    means = InTile(align(cb * rows * w * esize(ctx.bits(x))))
    at = op.attrs
    xs = row_major([1, c, h, w])
    commands: list[Command] = []
    for c0 in range(0, c, cb):
        c1 = min(c0 + cb, c)
        for r0 in range(0, h, rows):
            r1 = min(r0 + rows, h)
            last = r1 == h
            source = load(InTile(), ctx.addr[x], ctx.bits(x), [1, c1 - c0, r1 - r0, w], xs, [0, c0, r0, 0])
            compute = Step(
                "gap",
                dict(
                    src=InTile(), c=c1 - c0, hw=(r1 - r0) * w, in_bits=ctx.bits(x), in_zp=ctx.zero_point(x),
                    acc=acc, first=int(r0 == 0), last=int(last), m0=at.m0, shift=at.shift,
                    dst=means, out_bits=ctx.bits(y), out_zp=ctx.zero_point(y),
                ),
            )  # fmt: skip
            result = None
            if last:  # the channels' means are complete after their last rows
                box = [1, c1 - c0, 1, 1]
                result = store(means, ctx.addr[y], ctx.bits(y), box, row_major([1, c, 1, 1]), [0, c0, 0, 0])
            commands.append(Tile(bufs, [source], compute, result))
    return commands


def pool(ctx: OpContext, op: Op, sched: OpSchedule, maxpool: bool = False) -> list[Command]:
    x, y = op.inputs[0], op.outputs[0]
    _, c, h, w = ctx.shapes[x]
    _, _, oh, ow = ctx.shapes[y]
    (kh, kw), strides, dil, pads = pool_geometry(op, [h, w], maxpool)
    pt, pl = pads[0], pads[1]
    xb, yb = esize(ctx.bits(x)), esize(ctx.bits(y))
    paddr = None
    if not maxpool:  # per output position: M0 and shift of 1 / (window positions inside)
        m0 = ctx.arrays[op.arrays.m0].astype(np.int64)
        shift = ctx.arrays[op.arrays.shift].astype(np.int64)
        paddr = ctx.consts.add(op.arrays.m0 + "#pool", np.stack([m0, shift], axis=-1))
    cb, rows, cols = sched.extents
    bufs = sched.buffers(ctx.sram)
    pad_value = qrange(ctx.bits(x))[0] if maxpool else ctx.zero_point(x)
    # a window read through, a piece of a Concat written at its place (windows.py, allocation.py)
    xs, ys = ctx.strides(x), ctx.strides(y)
    commands: list[Command] = []
    for c0 in range(0, c, cb):
        c1 = min(c0 + cb, c)
        for r0 in range(0, oh, rows):
            r1 = min(r0 + rows, oh)
            for q0 in range(0, ow, cols):
                q1 = min(q0 + cols, ow)
                rows_in, top, inner_r, row0 = window(r0, r1, strides[0], kh, dil[0], pt, h)
                cols_in, left, inner_c, col0 = window(q0, q1, strides[1], kw, dil[1], pl, w)
                dst_at = align((c1 - c0) * rows_in * cols_in * xb)
                par = InTile(dst_at + align((c1 - c0) * (r1 - r0) * (q1 - q0) * yb))
                box, first = [1, c1 - c0, rows_in, cols_in], [0, c0, row0, col0]
                padding = (top, rows_in - top - inner_r, left, cols_in - left - inner_c)
                loads = [load(InTile(), ctx.addr[x], ctx.bits(x), box, xs, first, padding, pad_value)]
                if not maxpool:
                    loads.append(
                        load(par, paddr, 64, [1, r1 - r0, q1 - q0, 2], [0, ow * 2, 2, 1], [0, r0, q0, 0])
                    )
                compute = Step(
                    "pool",
                    dict(
                        src=InTile(), c=c1 - c0, in_h=rows_in, in_w=cols_in,
                        in_bits=ctx.bits(x), in_zp=ctx.zero_point(x),
                        kh=kh, kw=kw, sh=strides[0], sw=strides[1], dh=dil[0], dw=dil[1],
                        mode=0 if maxpool else 1, params=par if not maxpool else 0, dst=InTile(dst_at),
                        out_h=r1 - r0, out_w=q1 - q0, out_bits=ctx.bits(y), out_zp=ctx.zero_point(y),
                        **NO_PADS,
                    ),
                )  # fmt: skip
                box = [1, c1 - c0, r1 - r0, q1 - q0]
                result = store(InTile(dst_at), ctx.addr[y], ctx.bits(y), box, ys, [0, c0, r0, q0])
                commands.append(Tile(bufs, loads, compute, result))
    return commands


def avgpool(ctx: OpContext, op: Op, sched: OpSchedule) -> list[Command]:
    return pool(ctx, op, sched, maxpool=False)
