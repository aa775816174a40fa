"""Stripes: a region of layers whose feature maps are too large to stay in SRAM, run as horizontal
stripes that each go through the whole region (Vela's cascading, TPU-MLIR's layer groups sliced
along H).

A region is a run of ops on one NPU subgraph that reads one map from outside (its entry) and hands
one map on (its exit, the last op's result): convolutions (any group; transposed, of one group),
max pools, lookup tables, clamps, adds or muls with a constant that is the same on every row, and
element-wise adds and muls of two maps of the region (or of a map and a tensor of one row that is
the same for every row, a squeeze-excite gate). The simplest region is a chain, each op reading the
one before's result; a region may also branch and join, as a local response normalisation (x times
a function of the window sum of x squared) or a squeeze-excite block's tail (x + x * gate) do,
where every op from the branch to the join keeps rows where they are (element-wise ops, tables, 1x1
convolutions), so each branch needs the same rows of the map it shares. Where the region's maps are
large (an op's inputs and output together over half the resident budget), the region's exit is cut
into S row ranges; each range's rows are traced back through the region (a convolution or a max
pool needs (rows - 1) x stride + its kernel's extent rows of its input, less the padding it adds),
and the region is written S times over those rows: its ops on stripe-sized tensors (a convolution
or a pool pads only where its stripe meets the map's edge; a first convolution that alone reads the
entry reads its rows where they lie, a negative pad cropping the rest; otherwise the entry's rows
come through a Slice), and a Concat of the S results along H. Each stripe's intermediates are 1/S
of the maps and stay resident, so the region moves only its entry and its exit through DRAM; rows
at the seams are computed twice (the halo). Every output code is what the unstriped region
computes: the rewrite changes where rows are computed, not how.

`stripe` returns the rewritten program (new ops carry their layer's node name, so per-layer
figures add up by layer) or None when no region is that large; the code generator compiles both
and keeps the faster (compile.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from npubuild.intmodel.fixedpoint import quantize_multiplier
from npubuild.intmodel.kernels import conv_pads, pool_pads
from npubuild.intmodel.program import (
    ConcatAttrs,
    ConcatOp,
    IntegerModel,
    MoveOp,
    Op,
    Rescale,
    is_maxpool,
    maxpool_attrs,
)
from npubuild.targets.backend.fusion import Fusion
from npubuild.targets.backend.memory import tensor_bytes
from npubuild.targets.backend.schedule import TransposeRows
from npubuild.targets.cpu_cost import op_work

MAX_STRIPES = 16
MIN_STRIPE_ROWS = 4  # fewer output rows per stripe and the halos cost more than the DRAM saved


@dataclass(frozen=True)
class Striping:
    program: IntegerModel
    arrays: dict
    shapes: dict
    plan: dict
    chains: list[dict]  # per chain striped: its layers and the stripe count, for the stats
    rows: dict[str, tuple[int, int]]  # each stripe tensor -> the rows [a, b) of the map it holds
    # the maps a stripe passes from one of its ops to the next (to stay resident: `stripe_spills`)
    intermediates: frozenset[str]
    halo_macs: int  # multiply-accumulates the stripes compute twice (rows at their seams)


def _rows_needed(op: Op, shapes: dict, arrays: dict, lo: int, hi: int) -> tuple[int, int, int, int]:
    """The input rows [a, b) that output rows [lo, hi) of `op` read, and the padding rows the op
    adds above and below them."""
    if op.kind != "conv" and not is_maxpool(op):
        return lo, hi, 0, 0  # element-wise: the same rows (its first input may be a constant)
    h_in = int(shapes[op.inputs[0]][2])
    if is_maxpool(op):
        at = maxpool_attrs(op)
        kh, sh, dh, pt = at.kernel_shape[0], at.strides[0], at.dilations[0], _pool_pads(op, shapes)[0]
    else:
        kh = int(arrays[op.arrays.weight].shape[2])
        at = op.attrs
        if at.transpose:
            # the input rows its emitter reads for output rows [lo, hi); the padding returned is
            # the rows the stripe's own output crops above them (its pads' top)
            a, last = TransposeRows(op, h_in, kh)(lo, hi)
            return a, last + 1, lo + (at.pads or [0, 0, 0, 0])[0] - a * at.strides[0], 0
        sh, dh, pt = at.strides[0], at.dilations[0], _pads(op, shapes, arrays)[0]
    first = lo * sh - pt
    end = (hi - 1) * sh - pt + (kh - 1) * dh + 1
    a, b = max(first, 0), min(end, h_in)
    return a, b, a - first, end - b


def _pads(op: Op, shapes: dict, arrays: dict) -> list[int]:
    """A convolution's explicit pads [top, left, bottom, right] on its whole input."""
    return conv_pads(
        op.attrs, [int(d) for d in shapes[op.inputs[0]][2:]], list(arrays[op.arrays.weight].shape[2:])
    )


def _pool_pads(op: Op, shapes: dict) -> list[int]:
    """A max pool's pads [top, left, bottom, right] on its whole input, what ceil_mode adds
    included (a stripe states them all explicitly, ceil_mode off)."""
    return pool_pads([int(d) for d in shapes[op.inputs[0]][2:]], maxpool_attrs(op))


def _data(op: Op) -> list[str]:
    return [n for n in op.inputs if n and n not in op.constants]


def _eligible(op: Op, shapes: dict, arrays: dict) -> bool:
    """An op a stripe can run on a band of rows: the same rule on every row, and one data input,
    or two for an element-wise add or mul (`_joins`)."""
    data = _data(op)
    if len(op.outputs) != 1 or len(shapes.get(op.outputs[0], [])) != 4:
        return False
    if op.kind in ("add", "mul"):
        # a constant operand that varies along H would need its own slice
        if not all(np.ndim(arrays[k]) < 2 or np.shape(arrays[k])[-2] == 1 for k in op.constants.values()):
            return False
        return _joins(op, shapes) if len(data) == 2 else len(data) == 1 and len(shapes.get(data[0], [])) == 4
    if len(data) != 1 or len(shapes.get(data[0], [])) != 4:
        return False
    if op.kind == "conv":
        # a transposed one of one group (its emitter's): rows of its output need bands of its input
        return len(arrays[op.arrays.weight].shape) == 4 and (not op.attrs.transpose or op.attrs.group == 1)
    return op.kind in ("lut", "clamp") or is_maxpool(op) and len(maxpool_attrs(op).kernel_shape) == 2


def _joins(op: Op, shapes: dict) -> bool:
    """An element-wise op of two maps a stripe can run: each operand either a map of the result's
    shape (the same rows) or one row the same for every row (`_row_invariant`)."""
    out = [int(d) for d in shapes[op.outputs[0]]]
    return out[2] > 1 and all(
        [int(d) for d in shapes.get(n, [])] == out or _row_invariant(n, shapes) for n in _data(op)
    )


def _row_invariant(name: str, shapes: dict) -> bool:
    """A 4-D tensor of one row (a squeeze-excite gate [1, C, 1, 1]): every stripe reads all of it."""
    shape = shapes.get(name, [])
    return len(shape) == 4 and int(shape[2]) == 1


def _maps(op: Op, shapes: dict) -> list[str]:
    """The data inputs of `op` a stripe holds rows of: all of them, but for the one-row operand
    of an element-wise op of two (`_joins`), which every stripe reads whole."""
    data = _data(op)
    distinct = list(dict.fromkeys(data))
    return distinct if len(data) < 2 else [n for n in distinct if not _row_invariant(n, shapes)]


def _keeps_rows(op: Op, shapes: dict, arrays: dict) -> bool:
    """Whether output rows [lo, hi) of `op` read input rows [lo, hi) and no padding (element-wise
    ops, tables, clamps, 1x1 stride-1 convolutions and max pools)."""
    if op.kind != "conv" and not is_maxpool(op):
        return True
    height = int(shapes[op.outputs[0]][2])
    return all(_rows_needed(op, shapes, arrays, lo, hi) == (lo, hi, 0, 0) for lo, hi in ((0, height), (1, 2)))


class _Regions:
    """The program's regions (module docstring): which runs of ops qualify, found by growing each
    from an op in execution order."""

    def __init__(
        self, program: IntegerModel, arrays: dict, shapes: dict, plan: dict, joins: bool, pools: bool
    ):
        self.ops = program.ops
        self.shapes, self.arrays = shapes, arrays
        self.readers = program.readers()
        self.subgraph = {
            i: k for k, sg in enumerate(plan["subgraphs"]) if sg["device"] == "npu" for i in sg["ops"]
        }
        self.outputs = set(program.outputs)
        self.producer = {o: i for i, op in enumerate(self.ops) for o in op.outputs}
        self.ok = {
            i
            for i in self.subgraph
            if _eligible(self.ops[i], shapes, arrays)
            and (joins or len(_data(self.ops[i])) == 1)
            and (pools or not is_maxpool(self.ops[i]))
        }
        self.plan = plan

    def entry(self, part: list[int]) -> str | None:
        """The map `part` reads from outside, where `part` is a region; else None."""
        x, _ = self._verdict(part)
        return x

    def _verdict(self, part: list[int]) -> tuple[str | None, bool]:
        """(the entry or None, whether adding ops after `part` could still make it a region).
        A region: ops of one subgraph in execution order, reading one map from outside (the first
        op reads it) besides tensors of one row made before the region starts; its results other
        than the last are read only inside it and are no network output; and where two of its ops
        read one map, each op from the first of them to the last keeps rows where they are (after the
        join, an op may need more rows: both branches then run on those). Only results
        read outside can be mended by adding ops."""
        ops, inside = self.ops, set(part)
        made = {ops[i].outputs[0] for i in part}
        outside = set()
        for i in part:
            for n in _data(ops[i]):
                if n in made:
                    continue
                if n not in _maps(ops[i], self.shapes):
                    if self.producer.get(n, -1) >= part[0]:
                        return None, False  # made after the region's first op: the stripes run there
                    continue
                outside.add(n)
        if len(outside) != 1 or not outside <= set(_data(ops[part[0]])):
            return None, False
        (x,) = outside
        if any(ops[i].outputs[0] in self.outputs for i in part[:-1]):
            return None, False
        for name in (x, *made):
            users = sorted({j for j in self.readers.get(name, []) if j in inside})
            if len(users) > 1 and not all(
                _keeps_rows(ops[j], self.shapes, self.arrays) for j in part if users[0] <= j <= users[-1]
            ):
                return None, False
        if any(j not in inside for i in part[:-1] for j in self.readers.get(ops[i].outputs[0], [])):
            return None, True
        if not self._one_span_each(part):
            return None, False
        return x, True

    def _one_span_each(self, part: list[int]) -> bool:
        """Whether every map the region's ops read is needed in one span of rows for a stripe: rows
        at the exit's edges and in its middle traced back (`_traced`). Where two ops read one map,
        the ops from the first to the last keep rows (`_verdict`), but a branch may still widen
        its rows after the last reader (a 3x3 convolution before the join), and then the two
        readers would need different rows of the one map."""
        region = [self.ops[i] for i in part]
        height = int(self.shapes[region[-1].outputs[0]][2])
        middle = height // 2
        probes = {(0, height), (0, 1), (middle, middle + 1), (height - 1, height)}
        return all(_traced(region, self.shapes, self.arrays, lo, hi)[0] is not None for lo, hi in probes)

    def all(self) -> list[list[int]]:
        """Maximal regions, each grown from the first op in execution order no region holds yet."""
        claimed: set[int] = set()
        regions = []
        for sg in self.plan["subgraphs"]:
            for i in sg["ops"]:
                if i in self.ok and i not in claimed:
                    region = self._grow(i)
                    claimed.update(region)
                    regions.append(region)
        return regions

    def _grow(self, start: int) -> list[int]:
        """The longest region from `start`: add the earliest reader of a result that is read
        outside while that reader qualifies, keeping the longest run that is a region (a branch
        is one only once it joins again)."""
        part, best = [start], [start]
        while True:
            inside = set(part)
            waiting = {
                j for i in part for j in self.readers.get(self.ops[i].outputs[0], []) if j not in inside
            }
            if not waiting:
                return best
            j = min(waiting)
            if j not in self.ok or self.subgraph[j] != self.subgraph[start]:
                return best
            part.append(j)
            x, open_ = self._verdict(part)
            if x is not None:
                best = list(part)
            elif not open_:
                return best


def _stored_bytes(name: str, program: IntegerModel, shapes: dict, fused_away: frozenset[str]) -> int:
    if name in fused_away or name not in program.tensors:
        return 0
    return tensor_bytes(name, program.tensors, shapes)


def _plan_region(
    region: list[int],
    regions: _Regions,
    program: IntegerModel,
    shapes: dict,
    fused_away: frozenset[str],
    budget: int,
    to_the_end: bool,
    finer: bool,
) -> tuple[list[int], int, str] | None:
    """The part of the region worth striping (from its first op whose inputs and output together
    exceed half the budget to its last such op, or `to_the_end` of the region; widened to the
    nearest run that is a region itself, where a branch needs its join) and the stripe count: the
    fewest stripes that bring each op's inputs and output under half the budget, or with `finer`
    under a quarter (what else stays resident while a stripe runs, its other maps and the tensors
    other layers keep on chip, can leave half too little), and the part's entry; or None."""
    ops = program.ops

    def live(i: int) -> int:
        op = ops[i]
        return sum(_stored_bytes(n, program, shapes, fused_away) for n in (*_maps(op, shapes), op.outputs[0]))

    big = [k for k, i in enumerate(region) if live(i) > budget // 2]
    if not big:
        return None
    last = len(region) - 1 if to_the_end else big[-1]
    part, x = next(
        (
            (region[first : end + 1], x)
            for end in range(last, len(region))
            for first in range(big[0], -1, -1)
            if (x := regions.entry(region[first : end + 1])) is not None
        ),
        (None, None),
    )
    if part is None or len(part) < 2:
        return None
    peak = max(live(i) for i in part)
    rows = int(shapes[ops[part[-1]].outputs[0]][2])
    count = 1
    share = budget // 4 if finer else budget // 2
    while count < MAX_STRIPES and peak / count > share and rows // (count * 2) >= MIN_STRIPE_ROWS:
        count *= 2
    return (part, count, x) if count > 1 else None


def stripe(
    program: IntegerModel,
    arrays: dict,
    shapes: dict,
    plan: dict,
    fusion: Fusion,
    budget: int,
    to_the_end: bool = False,
    finer: bool = False,
    joins: bool = True,
    pools: bool = True,
) -> Striping | None:
    """The program with every region whose maps exceed the resident `budget` striped (module
    docstring), or None when there is none. A region's stripes end at its last large op, or with
    `to_the_end` at its last op: the smaller maps after a large one then stay in the stripes'
    SRAM too, which saves their DRAM round trip where residency does not hold them (DenseNet's
    3x3 convolution after a striped 1x1 one), at the cost of their halo rows. With `finer`, each
    region runs in twice the stripes where its rows allow (`_plan_region`). Without `joins`, the
    regions are chains (no op of two maps): the code generator tries both, since striping a
    branch and its join is not always faster (compile.py). Without `pools`, a max pool ends a
    region: one stripe's pool needs rows of the map before it that the next one needs as well, so
    a region through a pool computes those halo rows twice (Inception v1's stem is faster cut at
    its pools, ZFNet's first layer faster through its pool)."""
    if budget <= 0:
        return None
    regions = _Regions(program, arrays, shapes, plan, joins, pools)
    planned = []
    for region in regions.all():
        found = _plan_region(region, regions, program, shapes, fusion.fused_away, budget, to_the_end, finer)
        if found is not None:
            planned.append(found)
    if not planned:
        return None
    ops = list(program.ops)
    tensors = dict(program.tensors)
    arrays = dict(arrays)
    shapes = dict(shapes)
    replaced: dict[int, list[Op]] = {}
    dropped: set[int] = set()
    rows: dict[str, tuple[int, int]] = {}
    inner: set[str] = set()
    for part, count, x in planned:
        replaced[part[0]] = _striped(part, count, x, ops, tensors, arrays, shapes, rows, inner, len(replaced))
        dropped.update(part[1:])
    new_ops: list[Op] = []
    index: dict[int, list[int]] = {}
    for i, op in enumerate(ops):
        if i in dropped:
            index[i] = []
            continue
        block = replaced.get(i, [op])
        index[i] = list(range(len(new_ops), len(new_ops) + len(block)))
        new_ops.extend(block)
    subgraphs = [{**sg, "ops": [j for i in sg["ops"] for j in index[i]]} for sg in plan["subgraphs"]]
    return Striping(
        program=program.model_copy(update={"ops": new_ops, "tensors": tensors}),
        arrays=arrays,
        shapes=shapes,
        plan={**plan, "subgraphs": subgraphs},
        chains=[{"layers": [ops[i].label for i in part], "stripes": count} for part, count, _ in planned],
        rows=rows,
        intermediates=frozenset(inner),
        halo_macs=sum(op_work(op, shapes, arrays)[0] for op in new_ops)
        - sum(op_work(op, shapes, arrays)[0] for op in ops),
    )


def _striped(
    part: list[int],
    count: int,
    x: str,
    ops: list[Op],
    tensors: dict,
    arrays: dict,
    shapes: dict,
    rows: dict,
    inner: set,
    k: int,
) -> list[Op]:
    """The ops that compute the region `part` (entry `x`) in `count` stripes: per stripe a Slice
    of its entry (unless a convolution that alone reads it crops, or the stripe reads all of
    it) and the region's ops on their rows; then the Concat. `k` numbers the region: two regions
    may read the same entry, each through slices of its own. Adds each stripe tensor's rows to
    `rows`, and to `inner` the stripes' maps between their ops."""
    region = [ops[i] for i in part]
    y = region[-1].outputs[0]
    height = int(shapes[y][2])
    cuts = [height * s // count for s in range(count + 1)]
    first = region[0]
    # the first op, a convolution that alone reads the entry, reads its rows where they lie
    crops = (
        first.kind == "conv"
        and not first.attrs.transpose
        and sum(n == x for op in region for n in op.inputs) == 1
    )
    out: list[Op] = []
    pieces = []
    for s in range(count):
        need, borders = _traced(region, shapes, arrays, cuts[s], cuts[s + 1])
        assert need is not None, "two spans of one map in a stripe (`_Regions` lets none through)"
        a, b = need[x]
        source = x
        if crops:
            top, bottom = borders[0]
            borders[0] = (top - a, bottom - (int(shapes[x][2]) - b))
        elif (a, b) != (0, int(shapes[x][2])):
            source = f"{x}@chain{k}.input{s}"
            out.append(_row_slice(first.node, x, source, a, b, arrays, shapes, tensors))
            rows[source] = (a, b)
        mine = {x: source}
        for j, op in enumerate(region):
            result = op.outputs[0]
            mine[result] = f"{result}@stripe{s}"
            lo, hi = need[result]
            shapes[mine[result]] = [*shapes[result][:2], hi - lo, shapes[result][3]]
            rows[mine[result]] = (lo, hi)
            tensors[mine[result]] = tensors[result]
            data = set(_maps(op, shapes))
            inputs = [mine[n] if n in data else n for n in op.inputs]
            update: dict = {"inputs": inputs, "outputs": [mine[result]]}
            if op.kind == "conv" and op.attrs.transpose:
                source_rows = shapes[inputs[0]][2]
                update["attrs"] = _transposed_band(op, source_rows, hi - lo, borders[j][0], arrays)
            elif op.kind == "conv":
                pads = _pads(op, shapes, arrays)
                top, bottom = borders[j]
                update["attrs"] = op.attrs.model_copy(
                    update={"pads": [top, pads[1], bottom, pads[3]], "auto_pad": "NOTSET"}
                )
            elif is_maxpool(op):
                pads = _pool_pads(op, shapes)
                top, bottom = borders[j]
                update["attrs"] = {
                    **op.attrs,
                    "pads": [top, pads[1], bottom, pads[3]],
                    "ceil_mode": 0,
                    "auto_pad": "NOTSET",
                }
            out.append(op.model_copy(update=update))
            if j < len(region) - 1:
                inner.add(mine[result])
        pieces.append(mine[y])
    m0, shift = quantize_multiplier(1.0)
    same = Rescale(m0=m0, shift=shift, zin=tensors[y].zero_point, same=True)
    out.append(
        ConcatOp(
            kind="concat",
            node=region[-1].node,
            op_type="Concat",
            inputs=pieces,
            outputs=[y],
            attrs=ConcatAttrs(axis=2, rescale=[same] * count),
            operand_params=[tensors[y]] * count,
        )
    )
    return out


def _traced(
    region: list[Op], shapes: dict, arrays: dict, lo: int, hi: int
) -> tuple[dict[str, tuple[int, int]] | None, dict[int, tuple[int, int]]]:
    """The rows [a, b) each map of the region must hold for rows [lo, hi) of its exit, traced from
    the last op back to the entry, and the padding rows (top, bottom) each op adds; None for the
    rows where two ops that read one map need different rows of it."""
    need: dict[str, tuple[int, int]] = {region[-1].outputs[0]: (lo, hi)}
    borders = {}
    for j in reversed(range(len(region))):
        op = region[j]
        a, b, top, bottom = _rows_needed(op, shapes, arrays, *need[op.outputs[0]])
        borders[j] = (top, bottom)
        for n in _maps(op, shapes):
            if need.setdefault(n, (a, b)) != (a, b):
                return None, borders
    return need, borders


def _transposed_band(op: Op, rows_in: int, rows_out: int, crop: int, arrays: dict):
    """A transposed convolution's attributes on a band of `rows_in` input rows making `rows_out`
    output rows, the first `crop` rows of its full output cropped: the bottom crop what is left,
    or output padding where the band's output ends short of the rows asked for."""
    at = op.attrs
    kh = int(arrays[op.arrays.weight].shape[2])
    pads = list(at.pads or [0, 0, 0, 0])
    padding = list(at.output_padding or [0, 0])
    full = (rows_in - 1) * at.strides[0] + (kh - 1) * at.dilations[0] + 1
    bottom = full - crop - rows_out
    pads[0], pads[2], padding[0] = crop, max(bottom, 0), max(-bottom, 0)
    return at.model_copy(update={"pads": pads, "output_padding": padding, "auto_pad": "NOTSET"})


def _row_slice(node: str, x: str, y: str, a: int, b: int, arrays: dict, shapes: dict, tensors: dict) -> Op:
    """Rows [a, b) of x (axis 2) as tensor y."""
    keys = {}
    for name, value in (("starts", a), ("ends", b), ("axes", 2)):
        key = f"{y}#{name}"
        arrays[key] = np.array([value], np.int64)
        keys[key] = key
    shapes[y] = [*shapes[x][:2], b - a, shapes[x][3]]
    tensors[y] = tensors[x]
    return MoveOp(
        kind="move", node=node, op_type="Slice", inputs=[x, *keys], outputs=[y], constants=keys, attrs={}
    )
