"""Scheduling: how each op is cut into tiles that fit SRAM.

For every NPU op, the largest tile whose constants (weights, parameters, tables) plus two tile
buffers fit the op's SRAM (`SramPlan`), shrinking rows, then channels, then columns down to a
single element if it must: a layer too large is split, never an error. `split` then divides the
tile's outermost cut further, so that the DMA of tile t+1 can overlap the computation of tile t
(`pipeline.py` picks it with the cycle model). The result is an `OpSchedule`, which the emitters
read and nothing changes afterwards.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from npubuild.intmodel.kernels import nearest_indices, pool_pads
from npubuild.intmodel.ops import ALIASES
from npubuild.intmodel.program import Op, maxpool_attrs
from npubuild.targets.backend.context import OpContext
from npubuild.targets.backend.fusion import other_term
from npubuild.targets.backend.memory import (
    CHANNEL_PARAM_BYTES,
    DoesNotFit,
    SramPlan,
    align,
    esize,
    four,
    halve,
)


@dataclass(frozen=True)
class OpSchedule:
    """One op's tiling. `extents` per kind: conv (output channels, rows, columns); transposed conv
    (output channels, rows); matmul (rows, columns); global average pool (channels, rows); pool
    (channels, rows, columns); resize (channels, rows); element-wise ops and copies a 4-D block.
    `fixed` bytes of constants, `per_tile` bytes of each of the two tile buffers, `scratch` bytes
    of working space. Concat and Split schedule each input (output) as a `part` of its own."""

    extents: tuple[int, ...] = ()
    fixed: int = 0
    per_tile: int = 0
    scratch: int = 0
    parts: tuple[OpSchedule, ...] = ()

    def buffers(self, sram: SramPlan) -> tuple[int, int]:
        return sram.buffers(self.fixed, self.per_tile, self.scratch)


def schedule(
    ctx: OpContext, op: Op, split: int = 1, activation: Op | None = None, residual: Op | None = None
) -> OpSchedule | None:
    """The op's tiling (None for an op that moves nothing); DoesNotFit when none fits."""
    kind = op.kind
    if kind == "move":
        if op.op_type in ALIASES:
            return None
        if op.op_type == "MaxPool":
            return pool(ctx, op, split, maxpool=True)
        return copy(ctx, op, split)
    planner = SCHEDULERS.get(kind)
    if planner is None:
        raise DoesNotFit
    if kind == "conv":
        return planner(ctx, op, split, activation, residual)
    if kind == "mul":
        return planner(ctx, op, split, residual)
    return planner(ctx, op, split)


def span(n: int, stride: int, k: int, d: int) -> int:
    """Input positions that `n` output positions of a window read."""
    return (n - 1) * stride + (k - 1) * d + 1


def shrink(sram: SramPlan, sizes, extents: tuple[int, ...], order: tuple[int, ...], chunked=None, step=1):
    """The tiling decision: halve the tile's extents until `sizes(*extents)` (constant bytes, tile
    bytes[, scratch bytes]) fits the SRAM plan. While the constants alone overflow their slot, the
    weight-chunk axis `chunked` goes first (in multiples of `step`: whole groups); then the axes in
    `order`, each down to 1 (the chunk axis to `step`). DoesNotFit when nothing is left to halve."""
    ext = list(extents)

    def cut(axis: int) -> None:
        ext[axis] = max(step, halve(ext[axis]) // step * step) if axis == chunked else halve(ext[axis])

    while not sram.fits(*sizes(*ext)):
        if chunked is not None and not sram.consts_fit(sizes(*ext)[0]) and ext[chunked] > step:
            cut(chunked)
            continue
        axis = next((a for a in order if ext[a] > (step if a == chunked else 1)), None)
        if axis is None:
            raise DoesNotFit
        cut(axis)
    return ext


def window(o0: int, o1: int, stride: int, k: int, d: int, pad: int, size: int) -> tuple[int, int, int, int]:
    """Input extent of output positions [o0, o1): (positions incl. padding, leading padding,
    positions inside the tensor, first position inside the tensor)."""
    begin = o0 * stride - pad
    end = (o1 - 1) * stride - pad + (k - 1) * d + 1
    total = end - begin
    inside = max(0, min(end, size) - max(begin, 0))
    lead = min(max(0, -begin), total)
    first = min(max(begin, 0), max(size - 1, 0))
    return total, lead, inside, first


def conv(
    ctx: OpContext, op: Op, split: int, activation: Op | None = None, residual: Op | None = None
) -> OpSchedule:
    if op.attrs.transpose:
        return conv_transpose(ctx, op, split)
    x, raw = op.inputs[0], op.outputs[0]
    y = activation.outputs[0] if activation else raw
    table_bytes = align(ctx.table_bytes(activation)) if activation else 0
    _, c, h, w = ctx.shapes[x]
    _, oc, oh, ow = ctx.shapes[raw]
    kh, kw = ctx.arrays[op.arrays.weight].shape[2:]
    at = op.attrs
    sh, sw = at.strides
    dh, dw = at.dilations
    group = at.group
    og, cg = oc // group, c // group
    xb, yb = esize(ctx.bits(x)), output_bytes(ctx, y, residual)
    rb = esize(ctx.bits(other_term(residual, y))) if residual else 0

    def outputs(ocb, rows, cols):  # the result, then a residual Add's other input
        n = ocb * rows * cols
        return align(n * yb) + n * rb if residual else n * yb

    def sizes(ocb, rows, cols):
        fixed = table_bytes + ocb * cg * kh * kw + ocb * CHANNEL_PARAM_BYTES
        channels = c if group == 1 else (ocb // og) * cg
        # the output follows the input at the next aligned address (emit_mac.conv)
        tile = align(channels * span(rows, sh, kh, dh) * span(cols, sw, kw, dw) * xb) + outputs(
            ocb, rows, cols
        )
        return fixed, tile

    def inside_group(ocb, rows, cols):  # a chunk of one group's output channels reads its inputs
        fixed = table_bytes + ocb * cg * kh * kw + ocb * CHANNEL_PARAM_BYTES
        return fixed, align(cg * span(rows, sh, kh, dh) * span(cols, sw, kw, dw) * xb) + outputs(
            ocb, rows, cols
        )

    step = og if group > 1 else 1  # whole groups per chunk
    # a depthwise convolution of a resident map: whole channels first, as a max pool's. Its
    # channels are independent and each is a dense box, which a tile then reads where it lies,
    # borders and all (in_place.in_place); a tile of rows across every channel is a copy
    # (PP-OCRv4 det's stride-2 depthwise layers: copies the MAC array waited for). Fewer channels
    # per tile cost no array cycles: the depthwise mapping packs positions into spare columns.
    order = (1, 0, 2)
    if group > 1 and cg == 1 and ctx.resident(x):
        order = (0, 1, 2)
    if group > 1 and cg == 1 and x in ctx.shuffled:  # depthwise on a shuffle: whole runs of g
        step, order = ctx.shuffled[x], (1, 0, 2)
    try:
        ocb, rows, cols = shrink(ctx.sram, sizes, (oc, oh, ow), order=order, chunked=0, step=step)
    except DoesNotFit:
        if group == 1 or og == 1:
            raise
        # a single group is too large: chunks of its output channels (conv_chunks), never two
        # groups' in one chunk
        sizes = inside_group
        ocb, rows, cols = shrink(ctx.sram, sizes, (og, oh, ow), order=(1, 0, 2), chunked=0)
    if group == 1 and x not in ctx.shuffled:
        ocb = band_chunk(ctx.weight_use(op.arrays.weight), ocb, ctx.mac_cols)
    rows = -(-rows // split)
    return OpSchedule((ocb, rows, cols), *sizes(ocb, rows, cols))


def band_chunk(used: np.ndarray, ocb: int, cols: int) -> int:
    """Output channels per weight chunk of a convolution whose weights are a band, as an LRN's
    channel window is (recognise.decompose_lrn: 5 of 96 input channels per output): chunks as wide
    as the array's columns, where each of them reads only part of the input channels
    (`band_reads`). Otherwise `ocb`: a chunk reads every input channel, and more chunks only cost
    more loads. A dense layer is told by its first chunk. `used`: OpContext.weight_use."""
    oc, c = used.shape
    if not cols or ocb <= cols:
        return ocb
    narrow = all(band_reads(used, o0, cols) != (0, c) for o0 in range(0, oc, cols))
    return cols if narrow else ocb


def band_reads(used: np.ndarray, o0: int, n_out: int) -> tuple[int, int]:
    """The input channels [k0, k1) a chunk of a convolution of one group (output channels o0 ..
    o0 + n_out - 1) reads and sums: from the first to the last it has a weight other than zero
    for, where that is at most half of them (an LRN's channel window: 36 of 96 for 32 outputs);
    else all of them, [0, C) (a record of its own per chunk is not worth it for a dense layer with
    a dead channel at an edge). A weight of zero adds nothing (the input's zero point is taken off
    before the products), so the sums are the same. A chunk of no weights reads one channel: its
    bias alone. `used`: which input channels each output channel has a weight other than zero
    for (OpContext.weight_use)."""
    c = used.shape[1]
    read = np.flatnonzero(np.any(used[o0 : o0 + n_out], axis=0))
    k0, k1 = (int(read[0]), int(read[-1]) + 1) if read.size else (0, 1)
    return (k0, k1) if 2 * (k1 - k0) <= c else (0, c)


def output_bytes(ctx: OpContext, result: str, residual: Op | None) -> int:
    """Bytes per element of a convolution's or mul's output in its tile: its result's, or with a
    residual Add in its output path the wider of that and the sum's (written where it was)."""
    if residual is None:
        return esize(ctx.bits(result))
    return max(esize(ctx.bits(result)), esize(ctx.bits(residual.outputs[0])))


def conv_chunks(oc: int, group: int, ocb: int) -> list[tuple[int, int]]:
    """(first output channel, channels) of each weight chunk of a convolution: whole groups, or
    pieces of one group when a single group does not fit (`ocb` below the group's width)."""
    og = oc // group
    if group == 1 or ocb >= og:
        return [(o0, min(o0 + ocb, oc) - o0) for o0 in range(0, oc, ocb)]
    return [(g * og + k, min(ocb, og - k)) for g in range(group) for k in range(0, og, ocb)]


def conv_transpose(ctx: OpContext, op: Op, split: int) -> OpSchedule:
    x, y = op.inputs[0], op.outputs[0]
    _, c, h, w = ctx.shapes[x]
    _, oc, oh, ow = ctx.shapes[y]
    kh, kw = ctx.arrays[op.arrays.weight].shape[2:]  # [C, OC, kh, kw] (group 1)
    xb, yb = esize(ctx.bits(x)), esize(ctx.bits(y))
    rows_of = TransposeRows(op, h, kh)

    def sizes(ocb, rows):
        worst = max(rows_of.count(r, min(r + rows, oh)) for r in range(0, oh, rows))
        return ocb * c * kh * kw + ocb * CHANNEL_PARAM_BYTES, align(c * worst * w * xb) + ocb * rows * ow * yb

    ocb, rows = shrink(ctx.sram, sizes, (oc, oh), order=(1, 0), chunked=0)
    rows = -(-rows // split)
    return OpSchedule((ocb, rows), *sizes(ocb, rows))


@dataclass(frozen=True)
class TransposeRows:
    """The input rows a transposed convolution reads for a band of output rows."""

    op: Op
    h: int
    kh: int

    def __call__(self, r0: int, r1: int) -> tuple[int, int]:
        at = self.op.attrs
        pt = (at.pads if at.pads else [0, 0, 0, 0])[0]
        sh, dh = at.strides[0], at.dilations[0]
        i0 = min(max(math.ceil((r0 + pt - (self.kh - 1) * dh) / sh), 0), self.h - 1)
        i1 = min(max((r1 - 1 + pt) // sh, 0), self.h - 1)
        return i0, max(i1, i0)

    def count(self, r0: int, r1: int) -> int:
        i0, i1 = self(r0, r1)
        return i1 - i0 + 1


def matmul(ctx: OpContext, op: Op, split: int) -> OpSchedule:
    x, y = op.inputs[0], op.outputs[0]
    k, n = ctx.arrays[op.arrays.weight].shape
    m = int(np.prod(ctx.shapes[x], dtype=np.int64)) // k
    xb, yb = esize(ctx.bits(x)), esize(ctx.bits(y))

    def sizes(mb, nb):
        return k * nb + nb * CHANNEL_PARAM_BYTES, align(mb * k * xb) + mb * nb * yb

    mb, nb = shrink(ctx.sram, sizes, (m, n), order=(0, 1), chunked=1)
    nb = _widest_chunks(lambda b: ctx.sram.fits(*sizes(mb, b)), nb, n)
    mb = -(-mb // split)
    return OpSchedule((mb, nb), *sizes(mb, nb))


def _widest_chunks(fits, chunk: int, total: int) -> int:
    """A weight chunk as wide as fits, `total` then cut into chunks of equal width: halving stops
    up to half below what fits, and each chunk costs a DMA latency (ZFNet-512's FC6: 16 of 4,096
    outputs per 295 KB chunk where 21 fit its 384 KB slot, 256 chunks instead of 196)."""
    if chunk >= total:
        return chunk
    low, high = chunk, min(2 * chunk, total)  # fits(low); the widest that fits is below high
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if fits(mid) else (low, mid)
    chunks = -(-total // low)
    return -(-total // chunks)


def batch_matmul(ctx: OpContext, op: Op, split: int) -> OpSchedule:
    """Per batch, bands of A's rows times blocks of B's columns: both are loaded as tiles (no
    constants); the inner axis k stays whole."""
    a, b, y = op.inputs[0], op.inputs[1], op.outputs[0]
    m, k = ctx.shapes[a][-2:]
    n = ctx.shapes[b][-1]
    ab, bb, yb = esize(ctx.bits(a)), esize(ctx.bits(b)), esize(ctx.bits(y))

    def sizes(mb, nb):
        return 0, align(mb * k * ab) + align(k * nb * bb) + mb * nb * yb

    mb, nb = shrink(ctx.sram, sizes, (m, n), order=(0, 1))
    mb = -(-mb // split)
    return OpSchedule((mb, nb), *sizes(mb, nb))


def block(sram: SramPlan, shape4: list[int], need, split: int) -> list[int]:
    """Largest box (outer axes shrunk first) whose tile fits twice in SRAM with its constants;
    `need(box)` gives (constant bytes, tile bytes)."""
    b = list(shape4)
    for axis in range(4):
        while not sram.fits(*need(b)) and b[axis] > 1:
            b[axis] = 1 if axis == 0 else halve(b[axis])
    if not sram.fits(*need(b)):
        raise DoesNotFit
    for axis in range(4):  # pipelining: cut the outermost axis that has room
        if b[axis] > 1:
            b[axis] = -(-b[axis] // split)
            break
    return b


def blocked(sram: SramPlan, shape4: list[int], need, split: int) -> OpSchedule:
    blk = block(sram, shape4, need, split)
    return OpSchedule(tuple(blk), *need(blk))


def broadcast_box(shape: list[int], blk) -> list[int]:
    """The part of an operand (broadcast along its size-1 axes) that an output block reads."""
    return [bk if d != 1 else 1 for d, bk in zip(shape, blk)]


def binary(ctx: OpContext, op: Op, split: int, residual: Op | None = None) -> OpSchedule:
    y = op.outputs[0]
    out4 = four(ctx.shapes[y])
    operands = []
    for name in op.inputs:
        bits = ctx.bits(y) if name in op.constants else ctx.bits(name)
        operands.append((ctx.operand_shape(op, name), bits))
    for shape, _ in operands:
        if any(d not in (1, o) for d, o in zip(shape, out4)):
            raise DoesNotFit

    def need(blk):
        size = sum(int(math.prod(broadcast_box(shape, blk))) * esize(bits) for shape, bits in operands)
        return 0, size + int(math.prod(blk)) * output_bytes(ctx, y, residual) + 3 * 64

    sched = blocked(ctx.sram, out4, need, split)
    if any(name in ctx.upsampled for name in op.inputs) and list(sched.extents[2:]) != out4[2:]:
        raise DoesNotFit  # an upsample read through loads whole maps (upsamples.py)
    return sched


def unary(ctx: OpContext, op: Op, split: int, fixed: int = 0) -> OpSchedule:
    x, y = op.inputs[0], op.outputs[0]

    def need(blk):
        n = int(math.prod(blk))
        return fixed, align(n * esize(ctx.bits(x))) + n * esize(ctx.bits(y))

    return blocked(ctx.sram, four(ctx.shapes[y]), need, split)


def lut(ctx: OpContext, op: Op, split: int) -> OpSchedule:
    pinned = ctx.table_key(op) in ctx.pinned  # its table is not in the constant area
    return unary(ctx, op, split, fixed=0 if pinned else ctx.table_bytes(op))


def clamp(ctx: OpContext, op: Op, split: int) -> OpSchedule:
    return unary(ctx, op, split)


def concat(ctx: OpContext, op: Op, split: int) -> OpSchedule:
    y = op.outputs[0]
    parts = []
    for name in op.inputs:
        bits = ctx.bits(y) if name in op.constants else ctx.bits(name)

        def need(blk, bits=bits):
            n = int(math.prod(blk))
            return 0, align(n * esize(bits)) + n * esize(ctx.bits(y))

        parts.append(blocked(ctx.sram, ctx.operand_shape(op, name), need, split))
    return OpSchedule(parts=tuple(parts))


def global_avgpool(ctx: OpContext, op: Op, split: int) -> OpSchedule:
    x = op.inputs[0]
    _, c, h, w = ctx.shapes[x]
    xb = esize(ctx.bits(x))

    def sizes(cb, rows):  # a tile: its rows, then a 16-bit result per channel; scratch: int64 sums
        return 0, align(cb * rows * w * xb) + cb * 2, cb * 8

    # a resident map: whole channels first, as a max pool's. A map's channels are dense boxes,
    # which the tiles then read where they lie (in_place.in_place); tiles of rows across every
    # channel copied the map (PP-OCRv4 det's finest squeeze-excite pool: 614 KB, 9,638 cycles of
    # copies the MAC array waited for). In DRAM the map is loaded either way, and a tile of fewer
    # channels fills fewer of the array's columns (cycles.channelwise_cycles): rows first.
    cb, rows = shrink(ctx.sram, sizes, (c, h), order=(0, 1) if ctx.resident(x) else (1, 0))
    rows = -(-rows // split)
    return OpSchedule((cb, rows), *sizes(cb, rows))


def pool_geometry(op, hw: list[int], maxpool: bool):
    """(kernel, strides, dilations, pads) of a max or average pool."""
    at = maxpool_attrs(op) if maxpool else op.attrs
    strides = at.strides or [1, 1]
    dil = (at.dilations or [1, 1]) if maxpool else [1, 1]
    pads = pool_pads(hw, at.model_copy(update={"strides": strides, "dilations": dil}))
    return at.kernel_shape, strides, dil, pads


def pool(ctx: OpContext, op: Op, split: int, maxpool: bool = False) -> OpSchedule:
    x, y = op.inputs[0], op.outputs[0]
    _, c, h, w = ctx.shapes[x]
    _, _, oh, ow = ctx.shapes[y]
    (kh, kw), strides, dil, _ = pool_geometry(op, [h, w], maxpool)
    xb, yb = esize(ctx.bits(x)), esize(ctx.bits(y))

    def sizes(cb, rows, cols):
        tile = cb * span(rows, strides[0], kh, dil[0]) * span(cols, strides[1], kw, dil[1]) * xb
        # an average pool also loads its per-position (M0, shift), 16 bytes each
        return 0, align(tile) + align(cb * rows * cols * yb) + (0 if maxpool else rows * cols * 16)

    # a max pool's tiles are whole channels first (a resident map's channels are dense boxes, read
    # in place: in_place.in_place); an average pool's rows first, since each tile loads its
    # positions' (M0, shift) and tiles of channels would load all of them each
    cb, rows, cols = shrink(ctx.sram, sizes, (c, oh, ow), order=(0, 1, 2) if maxpool else (1, 0, 2))
    rows = -(-rows // split)
    return OpSchedule((cb, rows, cols), *sizes(cb, rows, cols))


def avgpool(ctx: OpContext, op: Op, split: int) -> OpSchedule:
    return pool(ctx, op, split, maxpool=False)


def resize_indices(op: Op, hw: list[int], out_hw: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """The source row and column of every output row and column of a nearest resize."""
    (h, w), (oh, ow) = hw, out_hw
    rows = nearest_indices(h, oh, op.attrs) if h != oh else np.arange(h)
    cols = nearest_indices(w, ow, op.attrs) if w != ow else np.arange(w)
    return rows, cols


def resize_nearest(ctx: OpContext, op: Op, split: int) -> OpSchedule:
    x, y = op.inputs[0], op.outputs[0]
    _, c, h, w = ctx.shapes[x]
    _, _, oh, ow = ctx.shapes[y]
    row_idx, _ = resize_indices(op, [h, w], [oh, ow])
    e = esize(ctx.bits(x))

    def sizes(cb, rows):
        worst = max(
            int(row_idx[min(r + rows, oh) - 1] - row_idx[r] + 1) if oh else 1 for r in range(0, oh, rows)
        )
        # the input rows the band reads, the output band, and the int32 row and column indices
        return 0, align(cb * worst * w * e) + align(cb * rows * ow * e) + (rows + ow) * 4

    cb, rows = shrink(ctx.sram, sizes, (c, oh), order=(1, 0))
    rows = -(-rows // split)
    return OpSchedule((cb, rows), *sizes(cb, rows))


def copy(ctx: OpContext, op: Op, split: int) -> OpSchedule:
    """Transpose, Slice and Split: a block of each output that is copied at a time."""
    if op.op_type not in ("Transpose", "Slice", "Split"):
        raise DoesNotFit
    e = esize(ctx.bits(op.inputs[0]))
    outputs = op.outputs if op.op_type == "Split" else op.outputs[:1]
    parts = [
        blocked(ctx.sram, four(ctx.shapes[out]), lambda b: (0, int(math.prod(b)) * e), split)
        for out in outputs
    ]
    return OpSchedule(parts=tuple(parts))


def row_shape(ctx: OpContext, op: Op) -> tuple[int, int]:
    """(rows, n) of a row op's input: n is its last axis."""
    shape = ctx.shapes[op.inputs[0]]
    return (math.prod(shape[:-1]), int(shape[-1])) if shape else (1, 1)


def row_constant(ctx: OpContext, op: Op) -> tuple[str, np.ndarray]:
    """(archive key, array) of a row op's constant: a Softmax's int32 exponent table, a
    LayerNormalization's int64 [n, 3] parameters."""
    if op.kind == "softmax":
        return op.arrays.table, ctx.arrays[op.arrays.table].astype(np.int32)
    return op.arrays.params, ctx.arrays[op.arrays.params].astype(np.int64)


def rows(ctx: OpContext, op: Op, split: int) -> OpSchedule:
    """Bands of whole rows (Softmax, LayerNormalization): the largest that fits twice with the
    table or parameters, then `split`."""
    count, n = row_shape(ctx, op)
    xb, yb = esize(ctx.bits(op.inputs[0])), esize(ctx.bits(op.outputs[0]))
    fixed = align(row_constant(ctx, op)[1].nbytes)

    def sizes(band):
        return fixed, align(band * n * xb) + band * n * yb

    (band,) = shrink(ctx.sram, sizes, (count,), order=(0,))
    band = -(-band // split)
    return OpSchedule((band,), *sizes(band))


SCHEDULERS = {
    "softmax": rows,
    "layernorm": rows,
    "conv": conv,
    "matmul": matmul,
    "batch_matmul": batch_matmul,
    "add": binary,
    "mul": binary,
    "lut": lut,
    "clamp": clamp,
    "concat": concat,
    "global_avgpool": global_avgpool,
    "avgpool": avgpool,
    "resize_nearest": resize_nearest,
}


def boxes(shape4: list[int], blk: list[int]):
    """(start, size) of every tile of a 4-D box."""
    ranges = [range(0, d, b) for d, b in zip(shape4, blk)]
    for s0 in ranges[0]:
        for s1 in ranges[1]:
            for s2 in ranges[2]:
                for s3 in ranges[3]:
                    start = [s0, s1, s2, s3]
                    yield start, [min(b, d - st) for st, b, d in zip(start, blk, shape4)]
