"""Tile commands of the MAC-array ops: convolution (with a fused activation), transposed
convolution, matrix multiplication. Weights and requantization parameters load per chunk of
output channels; inside a chunk, tiles of output rows and columns."""

from __future__ import annotations

import numpy as np

from npubuild.intmodel.kernels import conv_pads
from npubuild.intmodel.program import Op
from npubuild.targets.backend.commands import (
    Command,
    ConstLoads,
    InConst,
    InTile,
    Step,
    Tile,
    const_box,
    const_load,
    load,
    store,
)
from npubuild.targets.backend.context import OpContext
from npubuild.targets.backend.fusion import other_term
from npubuild.targets.backend.memory import CHANNEL_PARAM_BYTES, align, esize, four, row_major
from npubuild.targets.backend.schedule import (
    OpSchedule,
    TransposeRows,
    band_reads,
    conv_chunks,
    output_bytes,
    window,
)
from npubuild.targets.isa import NO_PADS, NO_RESIDUAL, NO_SUM_CLAMP, SUM_OPERANDS


def params_offset(weights_at: int, weight_bytes: int, channels: int, fixed: int) -> int:
    """Where a chunk's parameters go after its weights: aligned, or packed tight when alignment
    would overflow the constant area the schedule reserved."""
    at = weights_at + align(weight_bytes)
    if at + channels * CHANNEL_PARAM_BYTES > align(fixed):
        at = weights_at + weight_bytes
    return at


def conv(
    ctx: OpContext,
    op: Op,
    sched: OpSchedule,
    activation: Op | None = None,
    residual: Op | None = None,
    clamp: Op | None = None,
) -> list[Command]:
    if op.attrs.transpose:
        return conv_transpose(ctx, op, sched)
    x, raw = op.inputs[0], op.outputs[0]
    y = activation.outputs[0] if activation else raw  # the activation's result
    z = residual.outputs[0] if residual else y  # what is stored: the residual Add's, or that
    # a ReLU after the residual Add keeps the sum's codes and grid, and names what is stored
    sum_clamp = {"sum_min": clamp.attrs.min, "sum_max": clamp.attrs.max} if clamp else NO_SUM_CLAMP
    z = clamp.outputs[0] if clamp else z
    table_bytes, shifts_at = 0, -1
    if activation:
        taddr, table_size, shifts_at = ctx.table(activation)
        table_bytes = align(table_size)
    _, c, h, w = ctx.shapes[x]
    _, oc, oh, ow = ctx.shapes[raw]
    weight = ctx.arrays[op.arrays.weight]
    kh, kw = weight.shape[2:]
    at = op.attrs
    pt, pl, _, _ = conv_pads(at, [h, w], [kh, kw])
    sh, sw = at.strides
    dh, dw = at.dilations
    group = at.group
    og, cg = oc // group, c // group
    xb = esize(ctx.bits(x))
    ocb, rows, cols = sched.extents
    chunks = conv_chunks(oc, group, ocb)
    reads = (
        {o0: band_reads(ctx.weight_use(op.arrays.weight), o0, n_out) for o0, n_out in chunks}
        if group == 1 and x not in ctx.shuffled
        else {}
    )
    if any(k0 == 0 and k1 == c for k0, k1 in reads.values()) or not reads:
        waddr = ctx.consts.add(op.arrays.weight, weight.astype(np.int8))
    paddr = ctx.consts.add(op.arrays.bias + "#params", ctx.mac_params(op))
    bufs = sched.buffers(ctx.sram)
    output_path = _residual_operands(ctx, y, residual)
    commands: list[Command] = []
    inside = group > 1 and ocb < og  # chunks of one group's output channels
    for o0, n_out in chunks:
        wbase = table_bytes
        consts = []
        if activation and (o0 == 0 or ctx.sram.const_slot):  # each slot needs its own copy
            consts.append(const_load(0, taddr, table_size))
        ci0 = 0 if group == 1 else (o0 // og) * cg
        cin = c if group == 1 else cg if inside else (n_out // og) * cg
        k0, k1 = reads.get(o0, (0, c))
        if (k0, k1) != (0, c):  # the chunk's weights, those input channels only, in a record of its own
            ci0, cin = k0, k1 - k0
            trimmed = np.ascontiguousarray(weight[o0 : o0 + n_out, k0:k1]).astype(np.int8)
            weight_at, weight_bytes = (
                ctx.consts.add(f"{op.arrays.weight}#{o0}:{k0}-{k1}", trimmed),
                trimmed.size,
            )
        else:
            weight_at, weight_bytes = waddr + o0 * cg * kh * kw, n_out * cg * kh * kw
        consts.append(const_load(wbase, weight_at, weight_bytes))
        params_at = params_offset(wbase, weight_bytes, n_out, sched.fixed)
        consts.append(const_load(params_at, paddr + o0 * CHANNEL_PARAM_BYTES, n_out * CHANNEL_PARAM_BYTES))
        commands.append(ConstLoads(consts))
        for r0 in range(0, oh, rows):
            r1 = min(r0 + rows, oh)
            for c0 in range(0, ow, cols):
                c1 = min(c0 + cols, ow)
                rows_in, top, inner_r, row0 = window(r0, r1, sh, kh, dh, pt, h)
                cols_in, left, inner_c, col0 = window(c0, c1, sw, kw, dw, pl, w)
                dst = InTile(align(cin * rows_in * cols_in * xb))
                pads = (top, rows_in - top - inner_r, left, cols_in - left - inner_c)
                in_box, in_strides, in_start = _input_box(ctx, x, cin, rows_in, cols_in, ci0, row0, col0)
                source = load(
                    InTile(), ctx.addr[x], ctx.bits(x), in_box, in_strides, in_start, pads, ctx.zero_point(x)
                )
                loads, res = [source], {}
                box, start = [1, n_out, r1 - r0, c1 - c0], [0, o0, r0, c0]
                if residual:  # the Add's other input, after the output
                    other = other_term(residual, y)
                    at_res = InTile(
                        dst.offset + align(n_out * (r1 - r0) * (c1 - c0) * output_bytes(ctx, y, residual))
                    )
                    loads.append(
                        load(at_res, ctx.addr[other], ctx.bits(other), box, ctx.strides(other), start)
                    )
                    res = {"res": at_res}
                compute = Step(
                    "conv",
                    dict(
                        src=InTile(), in_c=cin, in_h=rows_in, in_w=cols_in,
                        in_bits=ctx.bits(x), in_zp=ctx.zero_point(x),
                        weights=InConst(wbase), params=InConst(params_at), dst=dst,
                        out_c=n_out, out_h=r1 - r0, out_w=c1 - c0,
                        out_bits=ctx.bits(raw), out_zp=ctx.zero_point(raw),
                        kh=kh, kw=kw, sh=sh, sw=sw, dh=dh, dw=dw,
                        group=1 if group == 1 or inside else n_out // og, min=at.min, max=at.max,
                        transpose=0, crop_top=0, crop_left=0,
                        lut=InConst(0) if activation else -1,
                        lut_offset=activation.attrs.offset if activation else 0,
                        lut_bits=ctx.bits(y),
                        lut_shift=activation.attrs.index_shift if activation else 0,
                        lut_shifts=InConst(shifts_at + o0) if shifts_at >= 0 else -1,
                        **output_path, **res, **NO_PADS, **sum_clamp,
                    ),
                )  # fmt: skip
                result = store(dst, ctx.addr[z], ctx.bits(z), box, ctx.strides(z), start)
                commands.append(Tile(bufs, loads, compute, result))
    return commands


def _input_box(
    ctx: OpContext, x: str, cin: int, rows: int, cols: int, ci0: int, row0: int, col0: int
) -> tuple[list[int], list[int], list[int]]:
    """(box, strides, start) of a conv tile's input load: channels [ci0, ci0 + cin) of rows and
    columns from (row0, col0). For a channel shuffle read through (shuffles.py), whose channel
    a*g + b is channel b*C/g + a of the tensor at its address, the runs of g: [cin/g, g, rows,
    cols] with strides [H*W, C/g*H*W, W, 1] (schedule.conv keeps ci0 and cin whole runs)."""
    _, c, h, w = ctx.shapes[x]
    g = ctx.shuffled.get(x)
    if g is None:
        return [1, cin, rows, cols], ctx.strides(x), [0, ci0, row0, col0]
    if ci0 % g or cin % g:
        raise ValueError(f"a tile of channels {ci0}..{ci0 + cin} of a shuffle of {g}: not whole runs")
    return [cin // g, g, rows, cols], [h * w, c // g * h * w, w, 1], [ci0 // g, 0, row0, col0]


def _residual_operands(ctx: OpContext, result: str, residual: Op | None) -> dict:
    """A conv instruction's residual Add operands (with one, all but its tile address `res`): the
    Add's parameters with the convolution's `result` as the first term."""
    if residual is None:
        return {k: NO_RESIDUAL[k] for k in ("res", "res_bits", *SUM_OPERANDS)}
    return {"res_bits": ctx.bits(other_term(residual, result)), **ctx.sum_operands(residual, result)}


def conv_transpose(ctx: OpContext, op: Op, sched: OpSchedule) -> list[Command]:
    x, y = op.inputs[0], op.outputs[0]
    _, c, h, w = ctx.shapes[x]
    _, oc, oh, ow = ctx.shapes[y]
    weight = ctx.arrays[op.arrays.weight]  # [C, OC, kh, kw] (group 1)
    kh, kw = weight.shape[2:]
    at = op.attrs
    pt, pl = (at.pads if at.pads else [0, 0, 0, 0])[:2]
    sh, sw = at.strides
    dh, dw = at.dilations
    xb = esize(ctx.bits(x))
    waddr = ctx.consts.add(op.arrays.weight, weight.astype(np.int8))
    paddr = ctx.consts.add(op.arrays.bias + "#params", ctx.mac_params(op))
    input_rows = TransposeRows(op, h, kh)
    ocb, rows = sched.extents
    bufs = sched.buffers(ctx.sram)
    xs, ys = ctx.strides(x), ctx.strides(y)
    commands: list[Command] = []
    for o0 in range(0, oc, ocb):
        n_out = min(o0 + ocb, oc) - o0
        # weights [C, OC, kh, kw]: the block's columns, gathered by a strided load
        weights = const_box(0, waddr, [1, c, n_out, kh * kw], [0, oc * kh * kw, kh * kw, 1], [0, 0, o0, 0])
        params_at = params_offset(0, c * n_out * kh * kw, n_out, sched.fixed)
        params = const_load(params_at, paddr + o0 * CHANNEL_PARAM_BYTES, n_out * CHANNEL_PARAM_BYTES)
        commands.append(ConstLoads([weights, params]))
        for r0 in range(0, oh, rows):
            r1 = min(r0 + rows, oh)
            i0, i1 = input_rows(r0, r1)
            n_in = i1 - i0 + 1
            dst = InTile(align(c * n_in * w * xb))
            source = load(InTile(), ctx.addr[x], ctx.bits(x), [1, c, n_in, w], xs, [0, 0, i0, 0])
            compute = Step(
                "conv",
                dict(
                    src=InTile(), in_c=c, in_h=n_in, in_w=w, in_bits=ctx.bits(x), in_zp=ctx.zero_point(x),
                    weights=InConst(0), params=InConst(params_at), dst=dst,
                    out_c=n_out, out_h=r1 - r0, out_w=ow, out_bits=ctx.bits(y), out_zp=ctx.zero_point(y),
                    kh=kh, kw=kw, sh=sh, sw=sw, dh=dh, dw=dw, group=1, min=at.min, max=at.max,
                    transpose=1, crop_top=r0 + pt - i0 * sh, crop_left=pl,
                    lut=-1, lut_offset=0, lut_bits=ctx.bits(y), lut_shift=0, lut_shifts=-1,
                    **_residual_operands(ctx, y, None), **NO_PADS, **NO_SUM_CLAMP,
                ),
            )  # fmt: skip
            result = store(dst, ctx.addr[y], ctx.bits(y), [1, n_out, r1 - r0, ow], ys, [0, o0, r0, 0])
            commands.append(Tile(bufs, [source], compute, result))
    return commands


def matmul(ctx: OpContext, op: Op, sched: OpSchedule) -> list[Command]:
    x, y = op.inputs[0], op.outputs[0]
    weight = ctx.arrays[op.arrays.weight]
    k, n = weight.shape
    m = int(np.prod(ctx.shapes[x], dtype=np.int64)) // k
    xb = esize(ctx.bits(x))
    waddr = ctx.consts.add(op.arrays.weight, weight.astype(np.int8))
    paddr = ctx.consts.add(op.arrays.bias + "#params", ctx.mac_params(op))
    mb, nb = sched.extents
    bufs = sched.buffers(ctx.sram)
    commands: list[Command] = []
    for n0 in range(0, n, nb):
        cols = min(n0 + nb, n) - n0
        weights = const_box(0, waddr, [1, 1, k, cols], [0, 0, n, 1], [0, 0, 0, n0])
        params_at = params_offset(0, k * cols, cols, sched.fixed)
        params = const_load(params_at, paddr + n0 * CHANNEL_PARAM_BYTES, cols * CHANNEL_PARAM_BYTES)
        commands.append(ConstLoads([weights, params]))
        for m0 in range(0, m, mb):
            m1 = min(m0 + mb, m)
            dst = InTile(align((m1 - m0) * k * xb))
            source = load(InTile(), ctx.addr[x], ctx.bits(x), [1, 1, m1 - m0, k], [0, 0, k, 1], [0, 0, m0, 0])
            compute = Step(
                "matmul",
                dict(
                    src=InTile(), m=m1 - m0, k=k, in_bits=ctx.bits(x), in_zp=ctx.zero_point(x),
                    weights=InConst(0), params=InConst(params_at), dst=dst, n=cols,
                    out_bits=ctx.bits(y), out_zp=ctx.zero_point(y),
                    min=op.attrs.min, max=op.attrs.max,
                ),
            )  # fmt: skip
            result = store(dst, ctx.addr[y], ctx.bits(y), [1, 1, m1 - m0, cols], [0, 0, n, 1], [0, 0, m0, n0])
            commands.append(Tile(bufs, [source], compute, result))
    return commands


def batch_matmul(ctx: OpContext, op: Op, sched: OpSchedule) -> list[Command]:
    """MatMul of two activations: for each batch (broadcast as numpy does), tiles of
    [rows of A] x [columns of B], both loaded by DMA."""
    a, b, y = op.inputs[0], op.inputs[1], op.outputs[0]
    sa, sb, sy = four(ctx.shapes[a]), four(ctx.shapes[b]), four(ctx.shapes[y])
    m, k, n = sa[2], sa[3], sb[3]
    ra, rb, ry = row_major(sa), row_major(sb), row_major(sy)
    # a batch axis of size 1 is read again for every batch of the output (stride 0)
    ra[:2] = [s if d > 1 else 0 for s, d in zip(ra[:2], sa[:2])]
    rb[:2] = [s if d > 1 else 0 for s, d in zip(rb[:2], sb[:2])]
    mb, nb = sched.extents
    bufs = sched.buffers(ctx.sram)
    at = op.attrs
    commands: list[Command] = []
    for i0 in range(sy[0]):
        for i1 in range(sy[1]):
            for n0 in range(0, n, nb):
                cols = min(n0 + nb, n) - n0
                for m0 in range(0, m, mb):
                    rows = min(m0 + mb, m) - m0
                    b_at = align(rows * k * esize(ctx.bits(a)))
                    dst = InTile(b_at + align(k * cols * esize(ctx.bits(b))))
                    loads = [
                        load(InTile(), ctx.addr[a], ctx.bits(a), [1, 1, rows, k], ra, [i0, i1, m0, 0]),
                        load(InTile(b_at), ctx.addr[b], ctx.bits(b), [1, 1, k, cols], rb, [i0, i1, 0, n0]),
                    ]
                    compute = Step(
                        "bmm",
                        dict(
                            a=InTile(), m=rows, k=k, a_bits=ctx.bits(a), za=at.za,
                            b=InTile(b_at), n=cols, b_bits=ctx.bits(b), zb=at.zb,
                            dst=dst, out_bits=ctx.bits(y), out_zp=ctx.zero_point(y), m0=at.m0, shift=at.shift,
                        ),
                    )  # fmt: skip
                    box = [1, 1, rows, cols]
                    result = store(dst, ctx.addr[y], ctx.bits(y), box, ry, [i0, i1, m0, n0])
                    commands.append(Tile(bufs, loads, compute, result))
    return commands
