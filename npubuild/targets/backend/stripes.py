"""Stripes: a region of layers whose feature maps are too large to stay in SRAM, run as horizontal
stripes that each go through the whole region (Vela's cascading, TPU-MLIR's layer groups sliced
along H).

A region is a run of ops on one NPU subgraph that reads maps from outside (its entries: usually
one, two where a join adds a map made elsewhere, a feature pyramid's upsampled level) and hands one
map on (its exit, the last op's result): convolutions (any group; transposed, of one group),
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
come through a Slice, as every other entry's do), and a Concat of the S results along H. Each
stripe's intermediates are 1/S of the maps and stay resident, so the region moves only its entries
and its exit through DRAM; rows
at the seams are computed twice (the halo). Every output code is what the unstriped region
computes: the rewrite changes where rows are computed, not how.

`stripe` returns the rewritten program (new ops carry their layer's node name, so per-layer
figures add up by layer) or None when no region is that large; the code generator compiles both
and keeps the faster (compile.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from npubuild.intmodel.fixedpoint import quantize_multiplier
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
from npubuild.targets.backend.stripe_rows import (
    conv_pads_whole,
    keeps_rows,
    pool_pads_whole,
    row_invariant,
    row_maps,
    row_repeats,
    traced,
    upsample_factor,
)
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


def _eligible(op: Op, shapes: dict, arrays: dict) -> bool:
    """An op a stripe can run on a band of rows: the same rule on every row, and one data input,
    or two for an element-wise add or mul (`_joins`)."""
    data = op.data_inputs
    if len(op.outputs) != 1 or len(shapes.get(op.outputs[0], [])) != 4:
        return False
    if op.kind in ("add", "mul"):
        # a constant operand that varies along H would need its own slice
        if not all(np.ndim(arrays[k]) < 2 or np.shape(arrays[k])[-2] == 1 for k in op.constants.values()):
            return False
        return _joins(op, shapes) if len(data) == 2 else len(data) == 1 and len(shapes.get(data[0], [])) == 4
    if op.kind == "concat":
        return _channel_concat(op, shapes)
    if len(data) != 1 or len(shapes.get(data[0], [])) != 4:
        return False
    if op.kind == "conv":
        # a transposed one of one group (its emitter's): rows of its output need bands of its input
        return len(arrays[op.arrays.weight].shape) == 4 and (not op.attrs.transpose or op.attrs.group == 1)
    if op.kind == "resize_nearest":
        return upsample_factor(op, shapes) > 0
    return op.kind in ("lut", "clamp") or is_maxpool(op) and len(maxpool_attrs(op).kernel_shape) == 2


def _joins(op: Op, shapes: dict) -> bool:
    """An element-wise op of two maps a stripe can run: each operand either a map of the result's
    shape (the same rows) or one row the same for every row (`row_invariant`)."""
    out = [int(d) for d in shapes[op.outputs[0]]]
    return out[2] > 1 and all(
        [int(d) for d in shapes.get(n, [])] == out or row_invariant(n, shapes) for n in op.data_inputs
    )


def _channel_concat(op: Op, shapes: dict) -> bool:
    """A concatenation along channels of maps as tall and wide as its result (a feature pyramid's
    levels, upsampled, joined for its head): rows of the result are the same rows of each map."""
    out = [int(d) for d in shapes[op.outputs[0]]]
    maps = [[int(d) for d in shapes.get(n, [])] for n in op.data_inputs]
    return (
        op.attrs.axis % 4 == 1
        and not op.constants
        and out[2] > 1
        and all(len(m) == 4 and m[2:] == out[2:] for m in maps)
    )


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
            and (joins or len(self.ops[i].data_inputs) == 1)
            and (pools or not is_maxpool(self.ops[i]))
        }
        self.plan = plan

    def entries(self, part: list[int]) -> tuple[str, ...] | None:
        """The maps `part` reads from outside, in the order its ops read them, where `part` is a
        region; else None."""
        entries, _ = self._verdict(part)
        return entries

    def _verdict(self, part: list[int]) -> tuple[tuple[str, ...] | None, bool]:
        """(the entries or None, whether adding ops after `part` could still make it a region).
        A region: ops of one subgraph in execution order, reading maps from outside (the first
        op reads one of them) besides tensors of one row made before the region starts; its results other
        than the last are read only inside it and are no network output; and where two of its ops
        read one map, each op from the first of them to the last keeps rows where they are (after the
        join, an op may need more rows: both branches then run on those). Only results
        read outside can be mended by adding ops."""
        ops, inside = self.ops, set(part)
        made = {ops[i].outputs[0] for i in part}
        outside = set()
        for i in part:
            for n in ops[i].data_inputs:
                if n not in row_maps(ops[i], self.shapes):
                    if self._made_from(n, part):
                        # a gate computed from the region's own rows has no rows to stripe
                        return None, False
                    continue
                if n not in made:
                    outside.add(n)
        if not outside & set(ops[part[0]].data_inputs):
            return None, False
        entries = tuple(dict.fromkeys(n for i in part for n in row_maps(ops[i], self.shapes) if n in outside))
        if any(ops[i].outputs[0] in self.outputs for i in part[:-1]):
            return None, False
        for name in (*entries, *made):
            users = sorted({j for j in self.readers.get(name, []) if j in inside})
            if len(users) > 1 and not all(
                keeps_rows(ops[j], self.shapes, self.arrays) for j in part if users[0] <= j <= users[-1]
            ):
                return None, False
        if any(j not in inside for i in part[:-1] for j in self.readers.get(ops[i].outputs[0], [])):
            return None, True
        if not self._one_span_each(part):
            return None, False
        return entries, True

    def _made_from(self, name: str, part: list[int]) -> bool:
        """Whether the one-row tensor `name` is made from the results of `part`'s ops. One made
        after the region's first op from other maps is fine: the stripes then run after it (a
        squeeze-excite gate pooled from the map before a pointwise convolution, docs/optimize.md
        `pools_before_widening_convs`, made after that convolution)."""
        inside, seen, todo = set(part), set(), [name]
        while todo:
            k = self.producer.get(todo.pop(), -1)
            if k in inside:
                return True
            if k < part[0] or k in seen:
                continue
            seen.add(k)
            todo.extend(self.ops[k].data_inputs)
        return False

    def late_operands(self, part: list[int]) -> list[str]:
        """The one-row tensors `part` reads that are made after its first op."""
        return [
            n
            for i in part
            for n in self.ops[i].data_inputs
            if n not in row_maps(self.ops[i], self.shapes) and self.producer.get(n, -1) >= part[0]
        ]

    def _one_span_each(self, part: list[int]) -> bool:
        """Whether every map the region's ops read is needed in one span of rows for a stripe: rows
        at the exit's edges and in its middle traced back (`traced`). Where two ops read one map,
        the ops from the first to the last keep rows (`_verdict`), but a branch may still widen
        its rows after the last reader (a 3x3 convolution before the join), and then the two
        readers would need different rows of the one map."""
        region = [self.ops[i] for i in part]
        height = int(self.shapes[region[-1].outputs[0]][2])
        middle = height // 2
        probes = {(0, height), (0, 1), (middle, middle + 1), (height - 1, height)}
        return all(traced(region, self.shapes, self.arrays, lo, hi)[0] is not None for lo, hi in probes)

    def all(self) -> list[list[int]]:
        """Maximal regions, each grown from the first op in execution order no region holds yet."""
        claimed: set[int] = set()
        regions = []
        for sg in self.plan["subgraphs"]:
            for i in sg["ops"]:
                if i in self.ok and i not in claimed:
                    region = self._grow(i, claimed)
                    claimed.update(region)
                    regions.append(region)
        return regions

    def _grow(self, start: int, claimed: set[int]) -> list[int]:
        """The longest region from `start`: add the earliest reader of a result that is read
        outside while that reader qualifies and no region before holds it (a join another region
        reached first, reading this one's map as its second entry), with the upsample that makes
        its other operand where only it reads that (a feature pyramid's join: the region then reads
        the smaller map), keeping the longest run that is a region (a branch is one only once it
        joins again)."""
        part, best = [start], [start]
        while True:
            inside = set(part)
            waiting = {
                j for i in part for j in self.readers.get(self.ops[i].outputs[0], []) if j not in inside
            }
            if not waiting:
                return best
            j = min(waiting)
            if j not in self.ok or j in claimed or self.subgraph[j] != self.subgraph[start]:
                return best
            part.append(j)
            for n in row_maps(self.ops[j], self.shapes):
                k = self.producer.get(n, -1)
                if (
                    k > start
                    and self.ops[k].kind == "resize_nearest"
                    and k in self.ok
                    and k not in claimed
                    and k not in part
                    and self.subgraph[k] == self.subgraph[start]
                    and set(self.readers.get(n, [])) <= set(part)
                ):
                    part.append(k)
            part.sort()
            entries, open_ = self._verdict(part)
            if entries is not None:
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
) -> tuple[list[int], int, tuple[str, ...]] | None:
    """The part of the region worth striping (from its first op whose inputs and output together
    exceed half the budget to its last such op, or `to_the_end` of the region; widened to the
    nearest run that is a region itself, where a branch needs its join; one entry preferred to
    several, as regions were before they could have several) and the stripe count: the fewest
    stripes that bring each op's inputs and output under half the budget, or with `finer` under a
    quarter (what else stays resident while a stripe runs, its other maps and the tensors other
    layers keep on chip, can leave half too little), and the part's entries; or None."""
    ops = program.ops

    def live(i: int) -> int:
        op = ops[i]
        return sum(
            _stored_bytes(n, program, shapes, fused_away) for n in (*row_maps(op, shapes), op.outputs[0])
        )

    big = [k for k, i in enumerate(region) if live(i) > budget // 2]
    if not big:
        return None
    last = len(region) - 1 if to_the_end else big[-1]
    part, entries = _first_part(
        region, regions, big[0], last, lambda n: _stored_bytes(n, program, shapes, fused_away)
    )
    if part is None or len(part) < 2:
        return None
    peak = max(live(i) for i in part)
    rows = int(shapes[ops[part[-1]].outputs[0]][2])
    count = 1
    share = budget // 4 if finer else budget // 2
    while count < MAX_STRIPES and peak / count > share and rows // (count * 2) >= MIN_STRIPE_ROWS:
        count *= 2
    return (part, count, entries) if count > 1 else None


def _first_part(
    region: list[int], regions: _Regions, first_big: int, last: int, stored: Callable[[str], int]
) -> tuple[list[int] | None, tuple[str, ...] | None]:
    """The run of `region` to stripe and its entries: the shortest run from at most `first_big` to
    at least `last` that is a region of one entry; else, over the runs of several entries ending
    at the first end that has one, the one whose entries are the fewest bytes (each stripe reads
    them through a Slice: the levels before their upsamples rather than after, where the
    upsamples can join the run)."""

    def ok(first: int, end: int) -> tuple[str, ...] | None:
        return regions.entries(region[first : end + 1])

    for end in range(last, len(region)):
        for first in range(first_big, -1, -1):
            if (entries := ok(first, end)) is not None and len(entries) == 1:
                return region[first : end + 1], entries
    for end in range(last, len(region)):
        runs = [(first, entries) for first in range(first_big, -1, -1) if (entries := ok(first, end))]
        if runs:
            first, entries = min(runs, key=lambda run: (sum(stored(n) for n in run[1]), -run[0]))
            return region[first : end + 1], entries
    return None, None


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
    counts: dict[int, int] = {}
    for k, (part, count, entries) in enumerate(planned):
        # the stripes run where the region's first op ran, or, where an entry or a one-row operand
        # is made later (a join's second map, a gate), at the first of its ops after all are made
        # (its other ops' results are read only inside it, so nothing between needs them sooner)
        late = (*entries, *regions.late_operands(part))
        made = max((regions.producer.get(n, -1) for n in late), default=-1)
        at = next(i for i in part if i > made)
        replaced[at], counts[k] = _striped(part, count, entries, ops, tensors, arrays, shapes, rows, inner, k)
        dropped.update(i for i in part if i != at)
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
        chains=[
            {"layers": [ops[i].label for i in part], "stripes": counts[k]}
            for k, (part, _, _) in enumerate(planned)
        ],
        rows=rows,
        intermediates=frozenset(inner),
        halo_macs=sum(op_work(op, shapes, arrays)[0] for op in new_ops)
        - sum(op_work(op, shapes, arrays)[0] for op in ops),
    )


def _striped(
    part: list[int],
    count: int,
    entries: tuple[str, ...],
    ops: list[Op],
    tensors: dict,
    arrays: dict,
    shapes: dict,
    rows: dict,
    inner: set,
    k: int,
) -> tuple[list[Op], int]:
    """The ops that compute the region `part` in `count` stripes: per stripe a Slice of each of
    its `entries` (unless a first convolution that alone reads it crops, or the stripe reads all
    of it) and the region's ops on their rows; then the Concat. `k` numbers the region: two
    regions may read the same entry, each through slices of its own. Adds each stripe tensor's rows to
    `rows`, and to `inner` the stripes' maps between their ops. Returns the ops and the count of
    stripes (fewer where whole repeats of an upsample's rows merge two)."""
    region = [ops[i] for i in part]
    y = region[-1].outputs[0]
    height = int(shapes[y][2])
    # stripes of whole repeats where the exit is (made from) an upsample's map
    repeat = row_repeats(region, shapes)[y]
    cuts = sorted({height * s // count // repeat * repeat for s in range(count)} | {height})
    count = len(cuts) - 1
    first = region[0]
    # the first op, a convolution that alone reads an entry, reads its rows where they lie
    crops = next(
        (
            x
            for x in entries
            if first.kind == "conv"
            and not first.attrs.transpose
            and x in first.inputs
            and sum(n == x for op in region for n in op.inputs) == 1
        ),
        None,
    )
    out: list[Op] = []
    pieces = []
    for s in range(count):
        need, borders = traced(region, shapes, arrays, cuts[s], cuts[s + 1])
        assert need is not None, "two spans of one map in a stripe (`_Regions` lets none through)"
        mine = {}
        for x in entries:
            a, b = need[x]
            mine[x] = x
            if x == crops:
                top, bottom = borders[0]
                borders[0] = (top - a, bottom - (int(shapes[x][2]) - b))
            elif (a, b) != (0, int(shapes[x][2])):
                mine[x] = f"{x}@chain{k}.input{s}"
                reader = next(op for op in region if x in op.inputs)
                out.append(_row_slice(reader.node, x, mine[x], a, b, arrays, shapes, tensors))
                rows[mine[x]] = (a, b)
        for j, op in enumerate(region):
            result = op.outputs[0]
            mine[result] = f"{result}@stripe{s}"
            lo, hi = need[result]
            shapes[mine[result]] = [*shapes[result][:2], hi - lo, shapes[result][3]]
            rows[mine[result]] = (lo, hi)
            tensors[mine[result]] = tensors[result]
            data = set(row_maps(op, shapes))
            inputs = [mine[n] if n in data else n for n in op.inputs]
            update: dict = {"inputs": inputs, "outputs": [mine[result]]}
            if op.kind == "conv" and op.attrs.transpose:
                source_rows = shapes[inputs[0]][2]
                update["attrs"] = _transposed_band(op, source_rows, hi - lo, borders[j][0], arrays)
            elif op.kind == "conv":
                pads = conv_pads_whole(op, shapes, arrays)
                top, bottom = borders[j]
                update["attrs"] = op.attrs.model_copy(
                    update={"pads": [top, pads[1], bottom, pads[3]], "auto_pad": "NOTSET"}
                )
            elif op.kind == "resize_nearest":
                update["attrs"] = op.attrs.model_copy(update={"out_shape": shapes[mine[result]]})
            elif is_maxpool(op):
                pads = pool_pads_whole(op, shapes)
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
    return out, count


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
