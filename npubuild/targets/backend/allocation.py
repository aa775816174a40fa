"""Allocation: where every tensor an NPU op touches lives.

Tensors produced and consumed only inside one NPU subgraph may stay resident in the top of SRAM
(first fit by liveness, in order of definition) and never touch DRAM: that is how a run of layers
becomes one group. The rest get DRAM buffers, reused once dead (first fit). Reshape-like ops alias
their input, a Split or Slice that cuts contiguous pieces is a view into it, and so is a channel
shuffle its readers read through (shuffles.py), with its channels permuted, and a Slice its
readers read as a strided box (windows.py), and so is a nearest upsample its readers read with
each element repeated (upsamples.py). Constants follow
the tensors in DRAM (`ConstantPool`). `verify_allocation` checks the result on its own terms.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from npubuild.intmodel.ops import ALIASES
from npubuild.intmodel.program import IntegerModel, Op
from npubuild.targets.backend.fusion import Fusion
from npubuild.targets.backend.memory import ALIGN, SRAM_FLAG, align, esize, four, row_major, tensor_bytes
from npubuild.targets.backend.shuffles import channel_shuffles
from npubuild.targets.backend.upsamples import upsample_views
from npubuild.targets.backend.windows import addresses_by_strides, row_windows, slice_cut


class AllocationError(Exception):
    """An allocation that breaks its own rules: a bug in the allocator, never a user's error."""


@dataclass(frozen=True)
class Buffer:
    """One allocated area: the tensors with this `root` (itself and its aliases and views) occupy
    [start, start + size) while op positions first..last run; `resident` ones are SRAM offsets
    from `Allocation.resident_base`, the others DRAM addresses."""

    root: str
    start: int
    size: int
    first: int
    last: int
    resident: bool


@dataclass
class Allocation:
    addr: dict[str, int]  # DRAM address, or SRAM_FLAG + SRAM address for a resident tensor
    resident: dict[str, int]  # resident tensors' SRAM addresses
    views: frozenset[int]  # indices of Split/Slice ops whose outputs are views of their input
    # (and channel shuffles read through: their results, the input's channels permuted -> g)
    tensor_area: int  # DRAM bytes of the tensors; the constants start there
    tile_sram: int  # SRAM left for the ops' constants and tiles, below the resident area
    sram_total: int
    resident_bytes: int = 0  # the budget asked for; the area is that, aligned
    buffers: list[Buffer] = field(default_factory=list)
    extent: dict[str, tuple[str, int, int]] = field(default_factory=dict)  # name -> (root, offset, bytes)
    shuffled: dict[str, int] = field(default_factory=dict)
    # windows read through (windows.py): their input's 4-D element strides
    windows: dict[str, list[int]] = field(default_factory=dict)
    # upsamples read through (upsamples.py): their input and its (row, column) factors
    upsampled: dict[str, tuple[str, int, int]] = field(default_factory=dict)
    # ops whose interval leaves resident tensors less than the area (intervals.py): their tile SRAM
    tile_sram_at: dict[int, int] = field(default_factory=dict)
    room: tuple[int, ...] = ()  # per position of the op sequence, the resident bytes it leaves
    # resident results that took the place of an operand dying with their op: {result: operand}
    in_place: dict[str, str] = field(default_factory=dict)


def view_parts(
    op: Op, tensors: dict, shapes: dict, arrays: dict, fused_away=frozenset()
) -> dict[str, int] | None:
    """A Split, or a step-1 Slice along one axis, whose outputs are contiguous pieces of its
    input (every axis before the cut has size 1) and keep its quantization: the outputs are
    views at these byte offsets, and the op moves nothing. None when it must copy."""
    x = op.inputs[0]
    if x not in tensors or x in fused_away:
        return None
    shape = [int(d) for d in shapes[x]]
    rank = len(shape)
    same = all(o in tensors and tensors[o] == tensors[x] for o in op.outputs if o)
    if not same or not all(op.outputs):
        return None
    size = esize(tensors[x].bits)
    if op.op_type == "Split":
        axis = op.attrs.get("axis", 0) % rank
        cuts = [(o, int(shapes[o][axis])) for o in op.outputs]
        begin = 0
    elif op.op_type == "Slice":
        cut = slice_cut(op, arrays, shape)
        if cut is None:
            return None
        axis, begin, end = cut
        cuts = [(op.outputs[0], end - begin)]
    else:
        return None
    if any(d != 1 for d in shape[:axis]):
        return None
    inner = int(np.prod(shape[axis + 1 :], dtype=np.int64)) * size
    parts, start = {}, begin
    for out, length in cuts:
        parts[out] = start * inner
        start += length
    return parts


def allocate(
    program: IntegerModel,
    arrays: dict,
    shapes: dict,
    plan: dict,
    sram_total: int,
    fusion: Fusion,
    reuse: bool = True,
    resident_bytes: int = 0,
    residency: Residency = "definition",
    caps: dict[int, int] | None = None,
    in_place: bool = False,
) -> Allocation:
    """DRAM buffers (and resident SRAM areas within `resident_bytes`) for every tensor an NPU op
    touches; without `reuse` every tensor keeps its own buffer (for checking every op's result).
    With `caps` (NPU op index -> bytes, intervals.py), each op leaves only its cap to resident
    tensors and tiles the rest: a resident tensor lies in the top `cap` bytes of SRAM at every op
    of its lifetime, and `resident_bytes` is the largest cap. With `in_place`, element-wise results
    may take the resident bytes of an operand that dies with their op (`_in_place_results`)."""
    ops, tensors = program.ops, program.tensors
    sequence = [i for sg in plan["subgraphs"] for i in sg["ops"]]
    npu = {i for sg in plan["subgraphs"] if sg["device"] == "npu" for i in sg["ops"]}
    root: dict[str, str] = {}
    offset: dict[str, int] = {}  # bytes from the root's address (views into a tensor)
    views: set[int] = set()
    shuffles = channel_shuffles(program, shapes, plan)
    shuffled = {name: g for names in shuffles.values() for name, g in names.items()}
    windows = row_windows(program, shapes, arrays, plan, fusion)
    strides: dict[str, list[int]] = {}
    strided = {ops[i].outputs[0] for i in windows} | set(shuffled)
    upsamples = upsample_views(program, shapes, plan, fusion, sram_total, strided)
    upsampled: dict[str, tuple[str, int, int]] = {}

    def find(n: str) -> str:
        while root.get(n, n) != n:
            n = root[n]
        return n

    def at(n: str) -> int:
        total = 0
        while root.get(n, n) != n:
            total, n = total + offset.get(n, 0), root[n]
        return total

    touched: set[str] = set()
    for i in npu:
        op = ops[i]
        for n in [*op.inputs, *op.outputs]:
            if n and n not in op.constants and n in tensors and n not in fusion.fused_away:
                touched.add(n)
        if i in upsamples:  # its readers repeat its input's elements as they load them
            root[op.outputs[0]], offset[op.outputs[0]] = op.inputs[0], 0
            upsampled[op.outputs[0]] = (op.inputs[0], *upsamples[i])
            views.add(i)
        elif (op.kind == "move" and op.op_type in ALIASES) or i in shuffles:
            root[op.outputs[0]] = op.inputs[0]
            if i in shuffles:  # its readers load the input's channels permuted
                views.add(i)
        elif op.kind == "move":
            parts = view_parts(op, tensors, shapes, arrays, fusion.fused_away)
            if parts is None and i in windows:  # not contiguous: its readers load a strided box
                parts = {op.outputs[0]: windows[i][0]}
                strides[op.outputs[0]] = windows[i][1]
            if parts is None:
                continue
            views.add(i)
            for out, start in parts.items():
                root[out], offset[out] = op.inputs[0], start
    outputs = set(program.outputs)
    boundary = outputs | set(program.inputs)
    writers = {n: j for j in npu for n in fusion.written(j, ops)}
    readers = program.readers()
    for i in sequence:
        if i in npu and ops[i].kind == "concat":
            _place_in_concat(ops[i], tensors, shapes, touched, boundary, root, offset, find, at)
            pieces = _pieces_in_concat(i, ops, tensors, shapes, touched, boundary, root, writers, readers)
            for x, (start, element_strides) in pieces.items():
                root[x], offset[x] = ops[i].outputs[0], start
                strides[x] = element_strides
    pairs = {}
    if in_place:
        pairs = _in_place_results(program, shapes, sequence, npu, fusion, touched, boundary, root)
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    for pos, i in enumerate(sequence):
        # the convolution writes its activation's or residual Add's result, reading the residual
        written = fusion.written(i, ops)
        for n in [*fusion.read(i, ops), *written]:
            if n in touched:
                r = find(n)
                first.setdefault(r, pos)
                last[r] = max(last.get(r, pos), pos)
    sizes: dict[str, int] = {}
    extent: dict[str, tuple[str, int, int]] = {}
    for n in touched:
        r = find(n)
        # (an upsample read through takes its input's bytes, not its own)
        nbytes = tensor_bytes(upsampled[n][0] if n in upsampled else n, tensors, shapes)
        extent[n] = (r, at(n), nbytes)
        if n in outputs or n in program.inputs:
            last[r] = len(sequence)
        sizes[r] = max(sizes.get(r, 0), at(n) + nbytes)
    members: dict[str, list[str]] = {}
    for n in touched:
        members.setdefault(find(n), []).append(n)
    eligible = _resident_candidates(program, plan, members)
    area = align(resident_bytes)
    room = [align(caps.get(i, resident_bytes)) if caps else area for i in sequence]
    buffers = (
        _place_resident(eligible, first, last, sizes, area, residency, room, pairs)
        if resident_bytes > 0
        else []
    )
    resident_base = sram_total - area
    on_chip = {b.root: SRAM_FLAG + resident_base + b.start for b in buffers}
    live: list[tuple[int, int, int]] = []  # (end position, start, size)
    placed: dict[str, int] = {}
    top = 0
    for r in sorted(first, key=lambda k: (first[k], k)):
        if r in on_chip:
            placed[r] = on_chip[r]
            continue
        live = [b for b in live if b[0] >= first[r] or not reuse]
        size = _buffer_size(sizes, r)
        start = first_fit(live, size)
        placed[r] = start
        live.append((last[r], start, size))
        buffers.append(Buffer(r, start, size, first[r], last[r], False))
        top = max(top, start + size)
    addr: dict[str, int] = {}
    resident: dict[str, int] = {}
    for n in touched:
        addr[n] = placed[find(n)] + at(n)
        if find(n) in on_chip:
            resident[n] = addr[n] - SRAM_FLAG
    return Allocation(
        addr=addr,
        resident=resident,
        views=frozenset(views),
        shuffled=shuffled,
        windows=strides,
        upsampled=upsampled,
        tensor_area=align(top),
        tile_sram=sram_total - area,
        tile_sram_at={i: sram_total - c for i, c in zip(sequence, room) if c != area},
        room=tuple(room),
        sram_total=sram_total,
        resident_bytes=resident_bytes,
        buffers=buffers,
        extent=extent,
        in_place=_shared_places(buffers, pairs),
    )


# element-wise ops whose result may take the place of an operand that dies with them
IN_PLACE_KINDS = ("add", "mul", "lut", "clamp")


def _in_place_results(program, shapes, sequence, npu, fusion, touched, boundary, root) -> dict[str, str]:
    """{result: operand} for element-wise NPU ops (with what fusion gives them: a residual Add, a
    clamp) whose result takes the buffer of a data operand of the same shape and grid width that
    nothing reads after them: one buffer instead of two while the op runs, as Vela's in-place
    element-wise ops. Element k of the result depends only on element k of that operand, and a
    tile's result goes where that tile's operand was, which no later tile reads. Neither may be a
    network input or output, nor already share a buffer (aliases, views, places in a Concat)."""
    ops, tensors = program.ops, program.tensors
    owner = {j: i for table in (fusion.residual, fusion.clamp, fusion.activation) for i, j in table.items()}
    position = {i: p for p, i in enumerate(sequence)}
    last_read: dict[str, int] = {}
    for j, op in enumerate(ops):
        p = position.get(owner.get(j, j), len(sequence))  # (an op of no subgraph: never)
        for n in op.inputs:
            last_read[n] = max(last_read.get(n, p), p)
    shared = set(root) | set(root.values())
    taken: dict[str, str] = {}
    for i in sequence:
        if i not in npu or ops[i].kind not in IN_PLACE_KINDS or i in fusion.absorbed:
            continue
        y = fusion.written(i, ops)[0]
        if y not in touched or y in boundary or y in shared or y in taken:
            continue
        for x in fusion.read(i, ops):
            if (
                x in touched
                and x not in ops[i].constants
                and x not in boundary
                and x not in shared
                and x not in taken.values()
                and list(shapes.get(x, ())) == list(shapes[y])
                and tensors[x].bits == tensors[y].bits
                and last_read.get(x) == position[i]
            ):
                taken[y] = x
                break
    return taken


def _pieces_in_concat(i: int, ops, tensors, shapes, touched, boundary, root, writers, readers) -> dict:
    """The inputs of Concat `i` whose places are not contiguous (rows of a [1, C, H, W] map: the
    stripes' results, stripes.py) that their producers write at their places with the Concat's
    strides, as windows of it (windows.py, read the other way): {input: (byte offset of its first
    element in the Concat's result, the result's 4-D element strides)}. Each must be its own buffer
    (no view of it, not a view itself), have the Concat's grid, be written by one NPU op whose
    emitter stores through `OpContext.strides` and be read by the Concat alone."""
    op = ops[i]
    y = op.outputs[0]
    if y not in touched or tensors.get(y) is None or len(shapes[y]) > 4:
        return {}
    if any(ops[k].kind == "concat" for k in readers.get(y, [])):
        return {}  # a Concat may move this one's buffer into its own, whose strides differ
    shape = four([int(d) for d in shapes[y]])
    axis = op.attrs.axis % len(shapes[y]) + (4 - len(shapes[y]))
    if all(d == 1 for d in shape[:axis]):
        return {}  # contiguous pieces: _place_in_concat's
    size = esize(tensors[y].bits)
    strides = row_major(shape)
    viewed = {root[n] for n in touched if n in root}  # tensors some view reads into
    found, start = {}, 0
    for x in op.inputs:
        here, start = start, start + int(four([int(d) for d in shapes[x]])[axis])
        j = writers.get(x)
        if (
            x not in touched
            or x in op.constants
            or x in boundary
            or tensors.get(x) != tensors[y]
            or root.get(x, x) != x
            or x in viewed
            or j is None
            or not addresses_by_strides(ops[j])
            or readers.get(x, []) != [i]
        ):
            continue
        found[x] = (here * strides[axis] * size, strides)
    return found


def _place_in_concat(op: Op, tensors, shapes, touched, boundary, root, offset, find, at) -> None:
    """Inputs of a Concat that already have its grid become views into its output at their places
    (`root` and `offset` updated), so their producers write them there and the Concat moves nothing
    for them (emit_data.concat skips an input found at its place). The places must be contiguous
    pieces (every axis before the Concat's has size 1). An input's whole buffer moves, with every
    view of it (a Split's pieces come with the tensor they cut), so it joins only where each input
    whose place that buffer covers is one of its views at exactly that place: nothing is ever
    copied into bytes a moved buffer holds. Network inputs and outputs never move."""
    y = op.outputs[0]
    if y not in touched or y in boundary or tensors.get(y) is None:
        return
    shape = [int(d) for d in shapes[y]]
    axis = op.attrs.axis % len(shape)
    if any(d != 1 for d in shape[:axis]):
        return
    inner = int(np.prod(shape[axis + 1 :], dtype=np.int64)) * esize(tensors[y].bits)
    places, start = [], 0
    for x in op.inputs:
        length = int(shapes[x][axis]) * inner
        places.append((x, start, length))
        start += length
    members: dict[str, list[str]] = {}
    for n in touched:
        members.setdefault(find(n), []).append(n)
    moved: set[str] = set()
    for x, here, _ in places:
        if x not in touched or x in op.constants or tensors.get(x) != tensors[y] or x in boundary:
            continue
        r = find(x)
        if r in moved or r == find(y) or r in boundary:
            continue
        begin = here - at(x)
        end = begin + max(at(n) + tensor_bytes(n, tensors, shapes) for n in members[r])
        covered = [(z, h, n) for z, h, n in places if h < end and begin < h + n]
        if (
            begin < 0
            or end > start
            or any(
                z not in touched or find(z) != r or at(z) != h - begin or h < begin or h + n > end
                for z, h, n in covered
            )
        ):
            continue
        root[r], offset[r] = y, begin
        moved.add(r)


def _resident_candidates(program: IntegerModel, plan: dict, members: dict[str, list[str]]) -> list[str]:
    """Roots whose tensors are all written and read inside one NPU subgraph, and are neither the
    network's inputs nor its outputs: those may stay in SRAM."""
    ops = program.ops
    device, group = {}, {}
    for k, sg in enumerate(plan["subgraphs"]):
        for i in sg["ops"]:
            device[i], group[i] = sg["device"], k
    writers: dict[str, list[int]] = {}
    readers = program.readers()
    for i, op in enumerate(ops):
        for n in op.outputs:
            writers.setdefault(n, []).append(i)
    boundary = set(program.outputs) | set(program.inputs)
    eligible = []
    for r, names in members.items():
        home = {group[i] for n in names for i in writers.get(n, []) if device.get(i) == "npu"}
        if len(home) != 1 or any(n in boundary for n in names):
            continue
        (k,) = home
        users = [i for n in names for i in readers.get(n, []) + writers.get(n, [])]
        if all(device.get(i) == "npu" and group.get(i) == k for i in users):
            eligible.append(r)
    return eligible


# The order in which resident candidates claim SRAM: by definition (the first tensor made claims
# first), or shortest lifetime first (a result its next op reads saves a store and a load for
# little SRAM time, where a long-lived one may hold its bytes across many layers).
Residency = Literal["definition", "lifetime"]


def _place_resident(
    eligible, first, last, sizes, budget: int, order: Residency = "definition", room=None, in_place=None
) -> list[Buffer]:
    """First fit by liveness inside the resident budget, candidates in `order`; a tensor that does
    not fit goes to DRAM. With `room` (bytes per position), a tensor lies in the top room bytes of
    the area at each position of its lifetime. The tensors of an in-place chain (`in_place`:
    {result: operand}, the operand last read by the op that writes the result, or by ops fused
    into it; a result may be the next op's operand, as a squeeze-excite block's `x + x * g` is
    the pyramid join's) are placed as one candidate, at one place for the chain's whole lifetime:
    placed one by one, a map that lives only between two of them took the bytes the chain
    needed (the example det's finest pyramid join went to DRAM, 1.2 MB of traffic). A chain that
    does not fit whole is placed tensor by tensor."""
    chains = _in_place_chains(in_place or {}, set(eligible), sizes)
    chain_of = {r: chain for chain in chains for r in chain}
    span = {id(c): (min(first[r] for r in c), max(last[r] for r in c)) for c in chains}

    def lifetime(r: str) -> tuple[int, int]:
        return span[id(chain_of[r])] if r in chain_of else (first[r], last[r])

    heads = [r for r in eligible if r not in chain_of or chain_of[r][0] == r]
    if order == "lifetime":
        ranked = sorted(heads, key=lambda k: (lifetime(k)[1] - lifetime(k)[0], lifetime(k)[0], k))
    else:
        ranked = sorted(heads, key=lambda k: (lifetime(k)[0], k))
    placed: list[Buffer] = []

    def place(members: list[str], begin: int, end: int) -> bool:
        size = max(_buffer_size(sizes, r) for r in members)
        floor = align(budget) - min(room[begin : end + 1]) if room else 0
        live = [(b.last, b.start, b.size) for b in placed if b.first <= end and begin <= b.last]
        start = first_fit(live, size, floor)
        if start + size > align(budget):
            return False
        placed.extend(Buffer(r, start, size, first[r], last[r], True) for r in members)
        return True

    for r in ranked:
        if r in chain_of:
            chain = chain_of[r]
            if not place(chain, *lifetime(r)):
                for member in chain:
                    place([member], first[member], last[member])
        else:
            place([r], first[r], last[r])
    return placed


def _buffer_size(sizes: dict[str, int], root: str) -> int:
    """The aligned bytes of a root tensor's buffer (at least one alignment unit)."""
    return align(max(sizes.get(root, 1), 1))


def _in_place_chains(in_place: dict[str, str], eligible: set[str], sizes: dict) -> list[list[str]]:
    """The in-place pairs among `eligible` tensors of one size, joined into chains (operand,
    result, its result, ...), each in the order its tensors are made."""
    after = {
        x: y
        for y, x in in_place.items()
        if x in eligible and y in eligible and _buffer_size(sizes, x) == _buffer_size(sizes, y)
    }
    results = set(after.values())
    chains = []
    for head in sorted(x for x in after if x not in results):
        chain = [head]
        while chain[-1] in after:
            chain.append(after[chain[-1]])
        chains.append(chain)
    return chains


def _shared_places(buffers: list[Buffer], in_place: dict[str, str]) -> dict[str, str]:
    """The in-place pairs that did get one place (both resident, the same bytes)."""
    where = {b.root: b for b in buffers if b.resident}
    return {
        y: x
        for y, x in in_place.items()
        if y in where and x in where and (where[y].start, where[y].size) == (where[x].start, where[x].size)
    }


def _one_place(in_place: dict[str, str], a: Buffer, b: Buffer) -> bool:
    """Whether a and b are an in-place pair on one place: the operand made before the result, the
    result written where it lies (that nothing reads the operand after the op that writes the
    result is `_in_place_results`' rule; the simulator and the hazard check see any break)."""
    for y, x in ((a, b), (b, a)):
        if in_place.get(y.root) == x.root and (x.start, x.size) == (y.start, y.size) and x.first <= y.first:
            return True
    return False


def first_fit(live: list[tuple[int, int, int]], size: int, floor: int = 0) -> int:
    """The lowest offset from `floor` up where `size` bytes fit between the live (end, start,
    size) buffers."""
    start = floor
    for _, s0, sz in sorted(live, key=lambda b: b[1]):
        if start + size <= s0:
            break
        start = max(start, s0 + sz)
    return start


def verify_allocation(allocation: Allocation) -> None:
    """Raise AllocationError unless: buffers are aligned; no two buffers of one memory overlap in
    bytes while both are live (positions first..last, inclusive); resident buffers lie inside the
    resident area at the top of SRAM and DRAM ones below the constants; every tensor lies inside
    its root's buffer at the address recorded for it."""
    by_root = {b.root: b for b in allocation.buffers}
    resident_room = allocation.sram_total - allocation.tile_sram
    for memory in (False, True):
        mine = sorted((b for b in allocation.buffers if b.resident is memory), key=lambda b: b.start)
        for k, a in enumerate(mine):
            if a.start % ALIGN or a.size % ALIGN or a.size <= 0:
                raise AllocationError(f"buffer of {a.root} at {a.start} (+{a.size}) is not aligned")
            end = resident_room if memory else allocation.tensor_area
            if a.start < 0 or a.start + a.size > end:
                raise AllocationError(
                    f"buffer of {a.root} [{a.start}, {a.start + a.size}) leaves its area (0, {end})"
                )
            if (
                memory
                and allocation.room
                and a.start < resident_room - min(allocation.room[a.first : a.last + 1])
            ):
                raise AllocationError(f"buffer of {a.root} at {a.start} is in an op's tiles while live")
            for b in mine[k + 1 :]:
                if b.start >= a.start + a.size:
                    break
                if memory and _one_place(allocation.in_place, a, b):
                    continue
                if a.first <= b.last and b.first <= a.last:
                    raise AllocationError(
                        f"{a.root} and {b.root} share bytes at {b.start} while both live "
                        f"({a.first}-{a.last}, {b.first}-{b.last})"
                    )
    base = allocation.tile_sram
    for name, (root, offset, nbytes) in allocation.extent.items():
        buffer = by_root.get(root)
        if buffer is None:
            raise AllocationError(f"{name} has no buffer (root {root})")
        if offset + nbytes > buffer.size:
            raise AllocationError(f"{name} ends past its buffer ({offset} + {nbytes} > {buffer.size})")
        expected = (SRAM_FLAG + base if buffer.resident else 0) + buffer.start + offset
        if allocation.addr.get(name) != expected:
            raise AllocationError(f"{name} is at {allocation.addr.get(name)}, its buffer says {expected}")
