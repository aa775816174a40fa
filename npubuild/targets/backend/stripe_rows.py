"""Which rows of each map a stripe needs (stripes.py): traced from the rows of a region's exit back
through its ops, a convolution or max pool needing (rows - 1) x stride + its kernel's extent rows
of its input less the padding it adds, an element-wise op the same rows, and a nearest upsample
the rows it repeats; where a map comes from an upsample, a stripe holds whole repeats of its rows
and the convolution after it crops the extra ones."""

from __future__ import annotations

from npubuild.intmodel.kernels import conv_pads, pool_pads
from npubuild.intmodel.program import Op, is_maxpool, maxpool_attrs
from npubuild.targets.backend.schedule import TransposeRows
from npubuild.targets.backend.upsamples import whole_factors


def rows_needed(op: Op, shapes: dict, arrays: dict, lo: int, hi: int) -> tuple[int, int, int, int]:
    """The input rows [a, b) that output rows [lo, hi) of `op` read, and the padding rows the op
    adds above and below them (an upsample's [lo, hi) are whole repeats, `traced`)."""
    if op.kind == "resize_nearest":
        factor = upsample_factor(op, shapes)
        return lo // factor, -(-hi // factor), 0, 0
    if op.kind != "conv" and not is_maxpool(op):
        return lo, hi, 0, 0  # element-wise: the same rows (its first input may be a constant)
    h_in = int(shapes[op.inputs[0]][2])
    if is_maxpool(op):
        at = maxpool_attrs(op)
        kh, sh, dh, pt = at.kernel_shape[0], at.strides[0], at.dilations[0], pool_pads_whole(op, shapes)[0]
    else:
        kh = int(arrays[op.arrays.weight].shape[2])
        at = op.attrs
        if at.transpose:
            # the input rows its emitter reads for output rows [lo, hi); the padding returned is
            # the rows the stripe's own output crops above them (its pads' top)
            a, last = TransposeRows(op, h_in, kh)(lo, hi)
            return a, last + 1, lo + (at.pads or [0, 0, 0, 0])[0] - a * at.strides[0], 0
        sh, dh, pt = at.strides[0], at.dilations[0], conv_pads_whole(op, shapes, arrays)[0]
    first = lo * sh - pt
    end = (hi - 1) * sh - pt + (kh - 1) * dh + 1
    a, b = max(first, 0), min(end, h_in)
    return a, b, a - first, end - b


def upsample_factor(op: Op, shapes: dict) -> int:
    """How many times a nearest Resize repeats each input row, where it repeats rows and columns
    a whole number of times (`upsamples.whole_factors`); else 0."""
    factors = whole_factors(op, shapes)
    return factors[0] if factors is not None else 0


def conv_pads_whole(op: Op, shapes: dict, arrays: dict) -> list[int]:
    """A convolution's explicit pads [top, left, bottom, right] on its whole input."""
    return conv_pads(
        op.attrs, [int(d) for d in shapes[op.inputs[0]][2:]], list(arrays[op.arrays.weight].shape[2:])
    )


def pool_pads_whole(op: Op, shapes: dict) -> list[int]:
    """A max pool's pads [top, left, bottom, right] on its whole input, what ceil_mode adds
    included (a stripe states them all explicitly, ceil_mode off)."""
    return pool_pads([int(d) for d in shapes[op.inputs[0]][2:]], maxpool_attrs(op))


def row_invariant(name: str, shapes: dict) -> bool:
    """A 4-D tensor of one row (a squeeze-excite gate [1, C, 1, 1]): every stripe reads all of it."""
    shape = shapes.get(name, [])
    return len(shape) == 4 and int(shape[2]) == 1


def row_maps(op: Op, shapes: dict) -> list[str]:
    """The data inputs of `op` a stripe holds rows of: all of them, but for the one-row operand
    of an element-wise op of two (`_joins`), which every stripe reads whole."""
    data = op.data_inputs
    distinct = list(dict.fromkeys(data))
    return distinct if len(data) < 2 else [n for n in distinct if not row_invariant(n, shapes)]


def keeps_rows(op: Op, shapes: dict, arrays: dict) -> bool:
    """Whether output rows [lo, hi) of `op` read input rows [lo, hi) and no padding (element-wise
    ops, tables, clamps, 1x1 stride-1 convolutions and max pools)."""
    if op.kind == "resize_nearest":
        return upsample_factor(op, shapes) == 1
    if op.kind != "conv" and not is_maxpool(op):
        return True
    height = int(shapes[op.outputs[0]][2])
    return all(rows_needed(op, shapes, arrays, lo, hi) == (lo, hi, 0, 0) for lo, hi in ((0, height), (1, 2)))


def traced(
    region: list[Op], shapes: dict, arrays: dict, lo: int, hi: int
) -> tuple[dict[str, tuple[int, int]] | None, dict[int, tuple[int, int]]]:
    """The rows [a, b) each map of the region must hold for rows [lo, hi) of its exit, traced from
    the last op back to the entry, and the padding rows (top, bottom) each op adds; None for the
    rows where two ops that read one map need different rows of it. A map an upsample made (and
    what element-wise ops make of it) is needed in whole repeats of its rows (`row_repeats`), so a
    convolution that reads it takes the rows around its own and crops them (negative padding)."""
    repeats = row_repeats(region, shapes)
    y = region[-1].outputs[0]
    need: dict[str, tuple[int, int]] = {y: whole_repeats(lo, hi, repeats[y], int(shapes[y][2]))}
    borders = {}
    for j in reversed(range(len(region))):
        op = region[j]
        a, b, top, bottom = rows_needed(op, shapes, arrays, *need[op.outputs[0]])
        repeat = max((repeats.get(n, 1) for n in row_maps(op, shapes)), default=1)
        if repeat > 1 and (op.kind == "conv" or is_maxpool(op)):
            if is_maxpool(op) or op.attrs.transpose:
                return None, borders  # (their bands are not cropped by padding)
            a2, b2 = whole_repeats(a, b, repeat, int(shapes[op.inputs[0]][2]))
            a, b, top, bottom = a2, b2, top - (a - a2), bottom - (b2 - b)
        borders[j] = (top, bottom)
        for n in row_maps(op, shapes):
            if need.setdefault(n, (a, b)) != (a, b):
                return None, borders
    return need, borders


def row_repeats(region: list[Op], shapes: dict) -> dict[str, int]:
    """For each map the region makes, the rows a stripe must hold it in whole multiples of: an
    upsample's factor times its input's, an element-wise op's the largest of its operands' (the
    factors are powers of two in practice; each divides the next), 1 after a convolution."""
    repeats: dict[str, int] = {}
    for op in region:
        below = max((repeats.get(n, 1) for n in row_maps(op, shapes)), default=1)
        if op.kind == "resize_nearest":
            repeats[op.outputs[0]] = upsample_factor(op, shapes) * below
        elif op.kind == "conv" or is_maxpool(op):
            repeats[op.outputs[0]] = 1
        else:
            repeats[op.outputs[0]] = below
    return repeats


def whole_repeats(a: int, b: int, repeat: int, height: int) -> tuple[int, int]:
    """Rows [a, b) widened to whole repeats of `repeat` rows, within the map's `height`."""
    return a // repeat * repeat, min(-(-b // repeat) * repeat, height)
