"""Softmax and LayerNormalization on the vector unit: the tensor is `rows x n` (n its last axis,
contiguous), cut into bands of whole rows; the op's table or per-element parameters load once."""

from __future__ import annotations

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
from npubuild.targets.backend.memory import align, esize
from npubuild.targets.backend.schedule import OpSchedule, row_constant, row_shape


def rows_op(ctx: OpContext, op: Op, sched: OpSchedule) -> list[Command]:
    x, y = op.inputs[0], op.outputs[0]
    rows, n = row_shape(ctx, op)
    key, constant = row_constant(ctx, op)
    caddr = ctx.consts.add(f"{key}#rows", constant)
    (band,) = sched.extents
    bufs = sched.buffers(ctx.sram)
    strides = [0, 0, n, 1]
    commands: list[Command] = [ConstLoads([const_load(0, caddr, constant.nbytes)])]
    for r0 in range(0, rows, band):
        count = min(r0 + band, rows) - r0
        dst = InTile(align(count * n * esize(ctx.bits(x))))
        args: dict = dict(src=InTile(), rows=count, n=n, in_bits=ctx.bits(x))
        if op.kind == "softmax":
            args.update(table=InConst(0), table_len=constant.size, rshift=op.attrs.rshift)
            args.update(dst=dst, out_bits=ctx.bits(y))
        else:
            args.update(in_zp=ctx.zero_point(x), eps=op.attrs.eps_codes, params=InConst(0))
            args.update(dst=dst, out_bits=ctx.bits(y), out_zp=ctx.zero_point(y))
        source = load(InTile(), ctx.addr[x], ctx.bits(x), [1, 1, count, n], strides, [0, 0, r0, 0])
        result = store(dst, ctx.addr[y], ctx.bits(y), [1, 1, count, n], strides, [0, 0, r0, 0])
        commands.append(Tile(bufs, [source], Step(op.kind, args), result))
    return commands
