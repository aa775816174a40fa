"""Code generation: NPU subgraphs of the integer model -> tiled instruction streams.

For every NPU op: pick tile sizes so that its constants (weights, parameters, tables) plus two
tile buffers (ping-pong, so the DMA-in of tile t+1 can overlap the computation of tile t) fit the
target's SRAM, shrinking rows, then channels, then columns down to a single element if it must (a
layer too large is split, never an error). Tensors live in DRAM between ops, allocated by
liveness so that dead buffers are reused; Reshape-like ops alias their input. Constants follow
the tensors in DRAM and ship in the binary's constants section.

Tokens (docs/npu.md): 0 constants loaded; 1/2 input tile in buffer A/B; 3/4 computed into A/B;
5/6 stored from A/B. A wait names the most recent signal of a token before it in the stream.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from npubuild.intmodel.codes import qrange
from npubuild.intmodel.kernels import conv_pads, nearest_indices, pool_pads
from npubuild.intmodel.ops import ALIASES
from npubuild.targets.cycles import estimate
from npubuild.targets.isa import NO_SIGNAL, Instruction
from npubuild.targets.spec import TargetSpec
from npubuild.targets.support import slice_steps

ALIGN = 64
T_CONST, T_IN, T_DONE, T_STORED = 0, (1, 2), (3, 4), (5, 6)
# With two constant slots, slot 0's loads signal token 0 and slot 1's token 7.
SLOT_TOKENS = (0, 7)
# A tensor kept in SRAM between the ops of one NPU subgraph has this bit in its address.
SRAM_FLAG = 1 << 40
# Row splits of the largest fitting tile that `pipelined` tries, and the cycles a split must save
# per instruction it adds (more instructions: a larger binary and a slower simulator).
PIPELINE_SPLITS = (1, 2, 4, 8)
PIPELINE_INSTRUCTION_CYCLES = 0
PIPELINE_MIN_GAIN = 0.02


# Per output channel, the requantization parameters a MAC layer loads with its weights: bias, M0
# and shift, each int64 (see Codegen.mac_params).
CHANNEL_PARAM_BYTES = 3 * 8


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def four(shape) -> list[int]:
    shape = [int(s) for s in shape]
    return [1] * (4 - len(shape)) + shape


def row_major(shape4) -> list[int]:
    strides, acc = [0] * 4, 1
    for i in range(3, -1, -1):
        strides[i] = acc
        acc *= shape4[i]
    return strides


def esize(bits: int) -> int:
    return 1 if bits == 8 else 2


def halve(n: int) -> int:
    return max(1, (n + 1) // 2)


class DoesNotFit(Exception):
    pass


@dataclass
class Stream:
    """One NPU subgraph's instructions, with the token bookkeeping of the ping-pong tiles."""

    code: list[Instruction] = field(default_factory=list)
    tile: int = 0
    # constant groups (one per weight chunk) when they alternate between two SRAM slots
    slot: int = 1
    const_token: int = T_CONST
    groups: list[list[int]] = field(default_factory=list)
    first_input: list[int | None] = field(default_factory=list)
    in_group: bool = False

    def emit(self, op: str, wait: int = 0, signal: int = NO_SIGNAL, **args) -> None:
        if op == "load" and signal in T_IN and self.first_input and self.first_input[-1] is None:
            self.first_input[-1] = len(self.code)
        self.in_group = False
        self.code.append(Instruction(op, args, wait, signal))

    def hoist_constants(self) -> tuple[list[int], set[int]]:
        """Move each constant group up to just after the first input load of the group before it,
        so the DMA fetches the next weights while the MAC array works on the current ones. Safe:
        a group writes the slot the group two back read, and its wait names the computes before
        its new place, which include every tile of that group. Returns each old index's new one
        and the old indices that moved."""
        moves: dict[int, list[int]] = {}
        for j in range(1, len(self.groups)):
            anchor = self.first_input[j - 1]
            if anchor is not None and anchor < self.groups[j][0]:
                moves.setdefault(anchor, []).extend(self.groups[j])
        moved = {i for group in moves.values() for i in group}
        order: list[int] = []
        for i in range(len(self.code)):
            if i in moved:
                continue
            order.append(i)
            order.extend(moves.get(i, []))
        self.code = [self.code[i] for i in order]
        position = [0] * len(order)
        for new, old in enumerate(order):
            position[old] = new
        return position, moved

    def begin_op(self) -> None:
        self.tile = 0

    def next_tile(self) -> int:
        b = self.tile % 2
        self.tile += 1
        return b

    def load_wait(self, b: int) -> int:
        # the buffer's previous tile must be stored (so computed too); an op's first tiles also
        # wait for the op before it to finish writing DRAM
        if self.tile <= 2:
            return (1 << T_STORED[0]) | (1 << T_STORED[1])
        return 1 << T_STORED[b]

    def compute_wait(self, b: int) -> int:
        return (1 << T_IN[b]) | (1 << T_STORED[b]) | (1 << self.const_token)


class Codegen:
    def __init__(
        self,
        program: dict,
        arrays: dict[str, np.ndarray],
        shapes: dict[str, list[int]],
        target: TargetSpec,
        plan: dict,
    ):
        self.program, self.arrays, self.shapes, self.target = program, arrays, shapes, target
        self.tensors = program["tensors"]
        self.plan = plan
        self.sram_total = target.sram_kib * 1024
        self.sram = self.sram_total  # the part ops tile into; the top is for resident tensors
        # >0: constants alternate between two slots of this size at the bottom of SRAM, so the next
        # chunk's weights load while this one computes; 0: constants sit under each op's tiles
        self.const_slot = 0
        self.split = 1  # extra division of the largest fitting tile (set by `pipelined`)
        self.resident: dict[str, int] = {}
        self.fusions: dict[int, dict] = {}  # id(conv op) -> the LUT op applied in its output path
        self.fused_luts: set[int] = set()
        self.fused_away: set[str] = set()  # conv results that never exist outside the MAC array
        self.views: set[int] = set()  # id() of Split/Slice ops whose outputs alias their input
        self.consts = bytearray()
        self.const_keys: dict[str, int] = {}
        self.addr: dict[str, int] = {}
        self.tensor_area = 0
        self._sizes: dict[str, int] = {}

    # --- DRAM ---------------------------------------------------------------------------------
    def fuse(self) -> None:
        """A LUT activation whose only input is a 2-D int8 convolution's result, read by nothing
        else, runs in that convolution's output path: one op, no intermediate tensor."""
        ops = self.program["ops"]
        device = {i: sg["device"] for sg in self.plan["subgraphs"] for i in sg["ops"]}
        group = {i: k for k, sg in enumerate(self.plan["subgraphs"]) for i in sg["ops"]}
        readers: dict[str, list[int]] = {}
        for i, op in enumerate(ops):
            for n in op["inputs"]:
                readers.setdefault(n, []).append(i)
        outputs = set(self.program["outputs"])
        for i, op in enumerate(ops):
            if op["kind"] != "conv" or op["attrs"]["transpose"] or device.get(i) != "npu":
                continue
            y = op["outputs"][0]
            users = readers.get(y, [])
            if len(users) != 1 or y in outputs or self.tensors[y]["bits"] != 8:
                continue
            (j,) = users
            lut = ops[j]
            if lut["kind"] == "lut" and device.get(j) == "npu" and group.get(j) == group.get(i):
                self.fusions[id(op)] = lut
                self.fused_luts.add(id(lut))
                self.fused_away.add(y)

    def allocate(self, reuse: bool = True, resident_bytes: int = 0) -> None:
        """Where every tensor an NPU op touches lives. Tensors produced and consumed only inside one
        NPU subgraph may stay in the top `resident_bytes` of SRAM (first fit by liveness, in order
        of definition) and never touch DRAM: that is how a run of layers becomes one group. The
        rest get DRAM buffers, reused once dead (first fit); without reuse every tensor keeps its
        own buffer (for checking every op's result)."""
        ops = self.program["ops"]
        sequence = [i for sg in self.plan["subgraphs"] for i in sg["ops"]]
        npu = {i for sg in self.plan["subgraphs"] if sg["device"] == "npu" for i in sg["ops"]}
        root: dict[str, str] = {}
        offset: dict[str, int] = {}  # bytes from the root's address (views into a tensor)

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
            for n in [*op["inputs"], *op["outputs"]]:
                if n and n not in op.get("constants", {}) and n in self.tensors and n not in self.fused_away:
                    touched.add(n)
            if op["kind"] == "move" and op["op_type"] in ALIASES:
                root[op["outputs"][0]] = op["inputs"][0]
            elif op["kind"] == "move" and (parts := self.view_parts(op)) is not None:
                self.views.add(id(op))
                for out, start in parts.items():
                    root[out], offset[out] = op["inputs"][0], start
        first: dict[str, int] = {}
        last: dict[str, int] = {}
        outputs = set(self.program["outputs"])
        for pos, i in enumerate(sequence):
            written = ops[i]["outputs"]
            if id(ops[i]) in self.fusions:  # the convolution writes its activation's result
                written = self.fusions[id(ops[i])]["outputs"]
            for n in [*ops[i]["inputs"], *written]:
                if n in touched:
                    r = find(n)
                    first.setdefault(r, pos)
                    last[r] = max(last.get(r, pos), pos)
        for n in touched:
            r = find(n)
            size = at(n) + int(np.prod(self.shapes[n], dtype=np.int64)) * esize(self.tensors[n]["bits"])
            if n in outputs or n in self.program["inputs"]:
                last[r] = len(sequence)
            self._sizes[r] = max(self._sizes.get(r, 0), size)
        on_chip = self._resident_roots(ops, root, find, touched, first, last, resident_bytes)
        live: list[tuple[int, int, int]] = []  # (end position, start, size)
        placed: dict[str, int] = {}
        top = 0
        for r in sorted(first, key=lambda k: (first[k], k)):
            if r in on_chip:
                placed[r] = on_chip[r]
                continue
            live = [b for b in live if b[0] >= first[r] or not reuse]
            size = _align(max(self._sizes.get(r, 1), 1))
            start = _first_fit(live, size)
            placed[r] = start
            live.append((last[r], start, size))
            top = max(top, start + size)
        for n in touched:
            self.addr[n] = placed[find(n)] + at(n)
            if find(n) in on_chip:
                self.resident[n] = self.addr[n] - SRAM_FLAG
        self.sram = self.sram_total - _align(resident_bytes)
        self.tensor_area = _align(top)

    def view_parts(self, op: dict) -> dict[str, int] | None:
        """A Split, or a step-1 Slice along one axis, whose outputs are contiguous pieces of its
        input (every axis before the cut has size 1) and keep its quantization: the outputs are
        views at these byte offsets, and the op moves nothing. None when it must copy."""
        x = op["inputs"][0]
        if x not in self.tensors or x in self.fused_away:
            return None
        shape = [int(d) for d in self.shapes[x]]
        rank = len(shape)
        same = all(o in self.tensors and self.tensors[o] == self.tensors[x] for o in op["outputs"] if o)
        if not same or not all(op["outputs"]):
            return None
        size = esize(self.tensors[x]["bits"])
        if op["op_type"] == "Split":
            axis = op["attrs"].get("axis", 0) % rank
            cuts = [(o, int(self.shapes[o][axis])) for o in op["outputs"]]
            begin = 0
        elif op["op_type"] == "Slice":
            consts = [
                self.arrays[op["constants"][i]] if i in op.get("constants", {}) else None
                for i in op["inputs"][1:]
            ]
            if len(consts) < 2 or consts[0] is None or consts[1] is None or len(consts[0]) != 1:
                return None
            axes = consts[2] if len(consts) > 2 and consts[2] is not None else [0]
            if any(step != 1 for step in slice_steps(op, self.arrays)):
                return None
            axis = int(axes[0]) % rank
            begin, end, _ = slice(int(consts[0][0]), int(consts[1][0]), 1).indices(shape[axis])
            cuts = [(op["outputs"][0], end - begin)]
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

    def _resident_roots(self, ops, root, find, touched, first, last, budget: int) -> dict[str, int]:
        if budget <= 0:
            return {}
        device, group = {}, {}
        for k, sg in enumerate(self.plan["subgraphs"]):
            for i in sg["ops"]:
                device[i], group[i] = sg["device"], k
        writers: dict[str, list[int]] = {}
        readers: dict[str, list[int]] = {}
        for i, op in enumerate(ops):
            for n in op["inputs"]:
                readers.setdefault(n, []).append(i)
            for n in op["outputs"]:
                writers.setdefault(n, []).append(i)
        boundary = set(self.program["outputs"]) | set(self.program["inputs"])
        members: dict[str, list[str]] = {}
        for n in touched:
            members.setdefault(find(n), []).append(n)
        eligible = []
        for r, names in members.items():
            home = {group[i] for n in names for i in writers.get(n, []) if device.get(i) == "npu"}
            if len(home) != 1 or any(n in boundary for n in names):
                continue
            (k,) = home
            users = [i for n in names for i in readers.get(n, []) + writers.get(n, [])]
            if all(device.get(i) == "npu" and group.get(i) == k for i in users):
                eligible.append(r)
        live: list[tuple[int, int, int]] = []
        placed = {}
        base = self.sram_total - _align(budget)
        for r in sorted(eligible, key=lambda k: (first[k], k)):
            live = [b for b in live if b[0] >= first[r]]
            size = _align(max(self._sizes.get(r, 1), 1))
            start = _first_fit(live, size)
            if start + size > _align(budget):
                continue
            placed[r] = SRAM_FLAG + base + start
            live.append((last[r], start, size))
        return placed

    def const(self, key: str, array: np.ndarray) -> int:
        """DRAM address of a constant array (deduplicated by key)."""
        if key not in self.const_keys:
            data = np.ascontiguousarray(array).tobytes()
            self.const_keys[key] = self.tensor_area + len(self.consts)
            self.consts += data + bytes(_align(len(data)) - len(data))
        return self.const_keys[key]

    def operand(self, op: dict, name: str, bits: int) -> tuple[int, list[int], int]:
        """(DRAM address, 4-D shape, bits) of a data tensor or a constant operand."""
        consts = op.get("constants", {})
        if name in consts:
            value = self.arrays[consts[name]]
            dtype = np.int8 if bits == 8 else np.int16
            return self.const(f"{consts[name]}@{bits}", value.astype(dtype)), four(value.shape), bits
        return self.addr[name], four(self.shapes[name]), self.tensors[name]["bits"]

    # --- DMA helpers ----------------------------------------------------------------------------
    @staticmethod
    def _dma(s: Stream, op: str, sram, far, bits, box, strides, start, **args) -> None:
        """One load or store of a 4-D box; `far` (a DRAM address, or a resident tensor's flagged
        SRAM address) is that of the box's first element once `start` is applied."""
        e = esize(bits) if bits in (8, 16) else bits // 8
        space, origin = _space(far + sum(int(a) * int(b) for a, b in zip(start, strides)) * e)
        box_args = {f"d{k}": box[k] for k in range(4)} | {f"s{k}": strides[k] for k in range(4)}
        s.emit(op, space=space, dram=origin, sram=sram, esize=e, **box_args, **args)

    def load(self, s: Stream, sram, dram, bits, box, strides, start, pads=(0, 0, 0, 0), value=0, **sync):
        """Load a box of `box` (SRAM dims incl. padding) whose unpadded part starts at `start`."""
        pad = dict(zip(("pad_top", "pad_bottom", "pad_left", "pad_right"), pads))
        self._dma(s, "load", sram, dram, bits, box, strides, start, **pad, pad_value=value, **sync)

    def store(self, s: Stream, sram, dram, bits, box, strides, start, **sync):
        self._dma(s, "store", sram, dram, bits, box, strides, start, **sync)

    def load_const(self, s: Stream, offset: int, addr: int, nbytes: int, signal=T_CONST) -> None:
        """Constants (weights, parameters, tables) at `offset` in this op's constant area."""
        self.const_dma(s, offset, addr, [1, 1, 1, nbytes], [0, 0, 0, 1], [0, 0, 0, 0], signal)

    def const_dma(self, s: Stream, offset: int, addr: int, box, strides, start, signal=T_CONST) -> None:
        """A constant load; it waits until the tiles that read the slot's last contents are done.
        Consecutive constant loads form one group; with slots, each group takes the other slot."""
        if self.const_slot and not s.in_group:
            s.slot ^= 1
            s.const_token = SLOT_TOKENS[s.slot]
            s.groups.append([])
            s.first_input.append(None)
        wait = (1 << T_DONE[0]) | (1 << T_DONE[1])
        at = len(s.code)
        signal = s.const_token if signal == T_CONST else signal
        self.load(s, self.const_base(s) + offset, addr, 8, box, strides, start, wait=wait, signal=signal)
        if self.const_slot:
            s.groups[-1].append(at)
            s.in_group = True

    def const_base(self, s: Stream) -> int:
        """SRAM address of the current constant group's area."""
        return s.slot * self.const_slot if self.const_slot else 0

    def consts_fit(self, fixed: int) -> bool:
        return not self.const_slot or fixed <= self.const_slot

    def buffers(self, fixed: int, per_tile: int, scratch: int = 0) -> tuple[int, int]:
        """SRAM addresses of the two tile buffers: after `fixed` bytes of constants, or after the
        two constant slots (and `scratch` bytes of the op's own working space)."""
        if not self.fits(fixed, per_tile, scratch):
            raise DoesNotFit
        base = 2 * self.const_slot + _align(scratch) if self.const_slot else _align(fixed + scratch)
        return base, base + _align(per_tile)

    def scratch_base(self) -> int:
        """Where an op's working space (not constants) starts: above the slots when there are any."""
        return 2 * self.const_slot

    def fits(self, fixed: int, per_tile: int, scratch: int = 0) -> bool:
        if self.const_slot:
            room = self.sram - 2 * self.const_slot - _align(scratch)
            return fixed <= self.const_slot and 2 * _align(per_tile) <= room
        return _align(fixed + scratch) + 2 * _align(per_tile) <= self.sram

    # --- per kind -------------------------------------------------------------------------------
    def emit(self, s: Stream, op: dict) -> None:
        s.begin_op()
        if id(op) in self.fused_luts or id(op) in self.views:
            return  # applied by the convolution before it, or a view of its input
        self.pipelined(s, op)

    def pipelined(self, s: Stream, op: dict) -> None:
        """Emit the op with the split of its largest fitting tile that the cycle model finds
        fastest. One tile leaves the DMA nothing to overlap; more tiles pipeline load, compute and
        store, but each costs a DMA latency and an instruction to simulate."""
        best: tuple[int, int] | None = None
        consts, keys = len(self.consts), dict(self.const_keys)
        for split in PIPELINE_SPLITS:
            trial = Stream(slot=s.slot, const_token=s.const_token)
            self.split = split
            try:
                self.emit_kind(trial, op)
            except DoesNotFit:
                if split == 1:
                    raise
                continue
            finally:  # a trial's constants (resize indices per row block) are not kept
                del self.consts[consts:]
                self.const_keys = dict(keys)
            if not trial.code:
                break
            # an instruction costs the simulator time: a split must save this many cycles per extra one
            cost = estimate(trial.code, self.target.model_dump())[
                "cycles"
            ] + PIPELINE_INSTRUCTION_CYCLES * len(trial.code)
            if best is None or cost < best[0] * (1 - PIPELINE_MIN_GAIN):
                best = (cost, split)
        self.split = best[1] if best else 1
        self.emit_kind(s, op)
        self.split = 1

    def emit_kind(self, s: Stream, op: dict) -> None:
        kind = op["kind"]
        if kind == "move":
            if op["op_type"] in ALIASES:
                return
            if op["op_type"] == "MaxPool":
                return self.pool(s, op, maxpool=True)
            return self.copy_op(s, op)
        getattr(self, kind if kind != "global_avgpool" else "gap")(s, op)

    def mac_params(self, op: dict) -> np.ndarray:
        a = op["arrays"]
        bias, m0, shift = (self.arrays[a[k]].astype(np.int64).reshape(-1) for k in ("bias", "m0", "shift"))
        return np.stack([bias, m0, shift], axis=1)

    def conv(self, s: Stream, op: dict) -> None:
        if op["attrs"]["transpose"]:
            return self.conv_transpose(s, op)
        x, raw = op["inputs"][0], op["outputs"][0]
        lut = self.fusions.get(id(op))
        y = lut["outputs"][0] if lut else raw  # what is stored: the activation's result when fused
        table_bytes = 0
        if lut:
            table = self.arrays[lut["arrays"]["table"]].astype(
                np.int8 if self.tensors[y]["bits"] == 8 else np.int16
            )
            taddr = self.const(lut["arrays"]["table"] + f"#{self.tensors[y]['bits']}", table)
            table_bytes = _align(table.nbytes)
        _, c, h, w = self.shapes[x]
        _, oc, oh, ow = self.shapes[raw]
        weight = self.arrays[op["arrays"]["weight"]]
        kh, kw = weight.shape[2:]
        at = op["attrs"]
        pt, pl, _, _ = conv_pads(at, [h, w], [kh, kw])
        sh, sw = at["strides"]
        dh, dw = at["dilations"]
        group = at["group"]
        og, cg = oc // group, c // group
        xb, yb = esize(self.tensors[x]["bits"]), esize(self.tensors[y]["bits"])
        params = self.mac_params(op)
        waddr = self.const(op["arrays"]["weight"], weight.astype(np.int8))
        paddr = self.const(op["arrays"]["bias"] + "#params", params)

        def in_channels(ocb: int) -> int:
            return c if group == 1 else (ocb // og) * cg

        def span(n: int, stride: int, k: int, d: int) -> int:
            return (n - 1) * stride + (k - 1) * d + 1

        def sizes(ocb, rows, cols):
            fixed = table_bytes + ocb * cg * kh * kw + ocb * CHANNEL_PARAM_BYTES
            tile = (
                in_channels(ocb) * span(rows, sh, kh, dh) * span(cols, sw, kw, dw) * xb
                + ocb * rows * cols * yb
            )
            return fixed, tile

        ocb, rows, cols = oc, oh, ow
        step = og if group > 1 else 1
        while not self.fits(*sizes(ocb, rows, cols)):
            if not self.consts_fit(sizes(ocb, rows, cols)[0]) and ocb > step:
                ocb = max(step, halve(ocb) // step * step)
            elif rows > 1:
                rows = halve(rows)
            elif ocb > step:
                ocb = max(step, halve(ocb) // step * step)
            elif cols > 1:
                cols = halve(cols)
            else:
                raise DoesNotFit
        rows = -(-rows // self.split)
        fixed, tile = sizes(ocb, rows, cols)
        bufs = self.buffers(fixed, tile)
        xs, ys = row_major([1, c, h, w]), row_major([1, oc, oh, ow])
        for o0 in range(0, oc, ocb):
            o1 = min(o0 + ocb, oc)
            n_out = o1 - o0
            wbase = table_bytes
            if lut:  # with slots each chunk's area needs its own copy of the table
                if o0 == 0 or self.const_slot:
                    self.load_const(s, 0, taddr, table.nbytes, signal=NO_SIGNAL)
            self.load_const(s, wbase, waddr + o0 * cg * kh * kw, n_out * cg * kh * kw, signal=NO_SIGNAL)
            params_at = wbase + _align(n_out * cg * kh * kw)
            if params_at + n_out * CHANNEL_PARAM_BYTES > _align(fixed):
                params_at = wbase + n_out * cg * kh * kw  # tight packing when alignment would not fit
            self.load_const(s, params_at, paddr + o0 * CHANNEL_PARAM_BYTES, n_out * CHANNEL_PARAM_BYTES)
            ci0 = 0 if group == 1 else (o0 // og) * cg
            cin = in_channels(n_out)
            for r0 in range(0, oh, rows):
                r1 = min(r0 + rows, oh)
                for c0 in range(0, ow, cols):
                    c1 = min(c0 + cols, ow)
                    b = s.next_tile()
                    rows_in, top, inner_r, row0 = _window(r0, r1, sh, kh, dh, pt, h)
                    cols_in, left, inner_c, col0 = _window(c0, c1, sw, kw, dw, pl, w)
                    src = bufs[b]
                    dst = src + _align(cin * rows_in * cols_in * xb)
                    self.load(
                        s,
                        src,
                        self.addr[x],
                        self.tensors[x]["bits"],
                        [1, cin, rows_in, cols_in],
                        xs,
                        [0, ci0, row0, col0],
                        (top, rows_in - top - inner_r, left, cols_in - left - inner_c),
                        self.tensors[x]["zero_point"],
                        wait=s.load_wait(b),
                        signal=T_IN[b],
                    )
                    s.emit(
                        "conv",
                        wait=s.compute_wait(b),
                        signal=T_DONE[b],
                        src=src,
                        in_c=cin,
                        in_h=rows_in,
                        in_w=cols_in,
                        in_bits=self.tensors[x]["bits"],
                        in_zp=self.tensors[x]["zero_point"],
                        weights=self.const_base(s) + wbase,
                        params=self.const_base(s) + params_at,
                        dst=dst,
                        out_c=n_out,
                        out_h=r1 - r0,
                        out_w=c1 - c0,
                        out_bits=self.tensors[raw]["bits"],
                        out_zp=self.tensors[raw]["zero_point"],
                        kh=kh,
                        kw=kw,
                        sh=sh,
                        sw=sw,
                        dh=dh,
                        dw=dw,
                        group=1 if group == 1 else n_out // og,
                        min=at["min"],
                        max=at["max"],
                        transpose=0,
                        crop_top=0,
                        crop_left=0,
                        lut=self.const_base(s) if lut else -1,
                        lut_offset=lut["attrs"]["offset"] if lut else 0,
                        lut_bits=self.tensors[y]["bits"],
                    )
                    self.store(
                        s,
                        dst,
                        self.addr[y],
                        self.tensors[y]["bits"],
                        [1, n_out, r1 - r0, c1 - c0],
                        ys,
                        [0, o0, r0, c0],
                        wait=1 << T_DONE[b],
                        signal=T_STORED[b],
                    )

    def conv_transpose(self, s: Stream, op: dict) -> None:
        x, y = op["inputs"][0], op["outputs"][0]
        _, c, h, w = self.shapes[x]
        _, oc, oh, ow = self.shapes[y]
        weight = self.arrays[op["arrays"]["weight"]]  # [C, OC, kh, kw] (group 1)
        kh, kw = weight.shape[2:]
        at = op["attrs"]
        pads = at["pads"] if at.get("pads") else [0, 0, 0, 0]
        pt, pl = pads[0], pads[1]
        sh, sw = at["strides"]
        dh, dw = at["dilations"]
        xb, yb = esize(self.tensors[x]["bits"]), esize(self.tensors[y]["bits"])
        params = self.mac_params(op)
        waddr = self.const(op["arrays"]["weight"], weight.astype(np.int8))
        paddr = self.const(op["arrays"]["bias"] + "#params", params)

        def input_rows(r0: int, r1: int) -> tuple[int, int]:
            i0 = min(max(math.ceil((r0 + pt - (kh - 1) * dh) / sh), 0), h - 1)
            i1 = min(max((r1 - 1 + pt) // sh, 0), h - 1)
            return i0, max(i1, i0)

        def sizes(ocb, rows):
            worst = max(
                (lambda a: a[1] - a[0] + 1)(input_rows(r, min(r + rows, oh))) for r in range(0, oh, rows)
            )
            return ocb * c * kh * kw + ocb * CHANNEL_PARAM_BYTES, c * worst * w * xb + ocb * rows * ow * yb

        ocb, rows = oc, oh
        while not self.fits(*sizes(ocb, rows)):
            if not self.consts_fit(sizes(ocb, rows)[0]) and ocb > 1:
                ocb = halve(ocb)
            elif rows > 1:
                rows = halve(rows)
            elif ocb > 1:
                ocb = halve(ocb)
            else:
                raise DoesNotFit
        rows = -(-rows // self.split)
        fixed, tile = sizes(ocb, rows)
        bufs = self.buffers(fixed, tile)
        xs, ys = row_major([1, c, h, w]), row_major([1, oc, oh, ow])
        for o0 in range(0, oc, ocb):
            o1 = min(o0 + ocb, oc)
            n_out = o1 - o0
            # weights [C, OC, kh, kw]: the block's columns, gathered by a strided load
            self.const_dma(
                s, 0, waddr, [1, c, n_out, kh * kw], [0, oc * kh * kw, kh * kw, 1], [0, 0, o0, 0], NO_SIGNAL
            )
            params_at = _align(c * n_out * kh * kw)
            if params_at + n_out * CHANNEL_PARAM_BYTES > _align(fixed):
                params_at = c * n_out * kh * kw
            self.load_const(s, params_at, paddr + o0 * CHANNEL_PARAM_BYTES, n_out * CHANNEL_PARAM_BYTES)
            for r0 in range(0, oh, rows):
                r1 = min(r0 + rows, oh)
                i0, i1 = input_rows(r0, r1)
                b = s.next_tile()
                src = bufs[b]
                n_in = i1 - i0 + 1
                dst = src + _align(c * n_in * w * xb)
                self.load(
                    s,
                    src,
                    self.addr[x],
                    self.tensors[x]["bits"],
                    [1, c, n_in, w],
                    xs,
                    [0, 0, i0, 0],
                    wait=s.load_wait(b),
                    signal=T_IN[b],
                )
                s.emit(
                    "conv",
                    wait=s.compute_wait(b),
                    signal=T_DONE[b],
                    src=src,
                    in_c=c,
                    in_h=n_in,
                    in_w=w,
                    in_bits=self.tensors[x]["bits"],
                    in_zp=self.tensors[x]["zero_point"],
                    weights=self.const_base(s),
                    params=self.const_base(s) + params_at,
                    dst=dst,
                    out_c=n_out,
                    out_h=r1 - r0,
                    out_w=ow,
                    out_bits=self.tensors[y]["bits"],
                    out_zp=self.tensors[y]["zero_point"],
                    kh=kh,
                    kw=kw,
                    sh=sh,
                    sw=sw,
                    dh=dh,
                    dw=dw,
                    group=1,
                    min=at["min"],
                    max=at["max"],
                    transpose=1,
                    crop_top=r0 + pt - i0 * sh,
                    crop_left=pl,
                    lut=-1,
                    lut_offset=0,
                    lut_bits=self.tensors[y]["bits"],
                )
                self.store(
                    s,
                    dst,
                    self.addr[y],
                    self.tensors[y]["bits"],
                    [1, n_out, r1 - r0, ow],
                    ys,
                    [0, o0, r0, 0],
                    wait=1 << T_DONE[b],
                    signal=T_STORED[b],
                )

    def matmul(self, s: Stream, op: dict) -> None:
        x, y = op["inputs"][0], op["outputs"][0]
        weight = self.arrays[op["arrays"]["weight"]]
        k, n = weight.shape
        m = int(np.prod(self.shapes[x], dtype=np.int64)) // k
        xb, yb = esize(self.tensors[x]["bits"]), esize(self.tensors[y]["bits"])
        waddr = self.const(op["arrays"]["weight"], weight.astype(np.int8))
        paddr = self.const(op["arrays"]["bias"] + "#params", self.mac_params(op))
        mb, nb = m, n
        while not self.fits(k * nb + nb * CHANNEL_PARAM_BYTES, mb * k * xb + mb * nb * yb):
            if not self.consts_fit(k * nb + nb * CHANNEL_PARAM_BYTES) and nb > 1:
                nb = halve(nb)
            elif mb > 1:
                mb = halve(mb)
            elif nb > 1:
                nb = halve(nb)
            else:
                raise DoesNotFit
        mb = -(-mb // self.split)
        fixed, tile = k * nb + nb * CHANNEL_PARAM_BYTES, mb * k * xb + mb * nb * yb
        bufs = self.buffers(fixed, tile)
        for n0 in range(0, n, nb):
            n1 = min(n0 + nb, n)
            cols = n1 - n0
            self.const_dma(s, 0, waddr, [1, 1, k, cols], [0, 0, n, 1], [0, 0, 0, n0], NO_SIGNAL)
            params_at = _align(k * cols)
            if params_at + cols * CHANNEL_PARAM_BYTES > _align(fixed):
                params_at = k * cols
            self.load_const(s, params_at, paddr + n0 * CHANNEL_PARAM_BYTES, cols * CHANNEL_PARAM_BYTES)
            for m0 in range(0, m, mb):
                m1 = min(m0 + mb, m)
                b = s.next_tile()
                src = bufs[b]
                dst = src + _align((m1 - m0) * k * xb)
                self.load(
                    s,
                    src,
                    self.addr[x],
                    self.tensors[x]["bits"],
                    [1, 1, m1 - m0, k],
                    [0, 0, k, 1],
                    [0, 0, m0, 0],
                    wait=s.load_wait(b),
                    signal=T_IN[b],
                )
                s.emit(
                    "matmul",
                    wait=s.compute_wait(b),
                    signal=T_DONE[b],
                    src=src,
                    m=m1 - m0,
                    k=k,
                    in_bits=self.tensors[x]["bits"],
                    in_zp=self.tensors[x]["zero_point"],
                    weights=self.const_base(s),
                    params=self.const_base(s) + params_at,
                    dst=dst,
                    n=cols,
                    out_bits=self.tensors[y]["bits"],
                    out_zp=self.tensors[y]["zero_point"],
                    min=op["attrs"]["min"],
                    max=op["attrs"]["max"],
                )
                self.store(
                    s,
                    dst,
                    self.addr[y],
                    self.tensors[y]["bits"],
                    [1, 1, m1 - m0, cols],
                    [0, 0, n, 1],
                    [0, 0, m0, n0],
                    wait=1 << T_DONE[b],
                    signal=T_STORED[b],
                )

    # element-wise ------------------------------------------------------------------------------
    def blocks(self, shape4: list[int], need) -> list[int]:
        """Largest box (outer axes shrunk first) whose tile fits twice in SRAM with `fixed`."""
        b = list(shape4)
        for axis in range(4):
            while not self.fits(*need(b)) and b[axis] > 1:
                b[axis] = 1 if axis == 0 else halve(b[axis])
        if not self.fits(*need(b)):
            raise DoesNotFit
        for axis in range(4):  # pipelining: cut the outermost axis that has room
            if b[axis] > 1:
                b[axis] = -(-b[axis] // self.split)
                break
        return b

    def binary(self, s: Stream, op: dict, kind: str) -> None:
        y = op["outputs"][0]
        yt = self.tensors[y]
        out4 = four(self.shapes[y])
        ops = [self.operand(op, name, yt["bits"]) for name in op["inputs"]]
        for _, shape, _ in ops:
            if any(d not in (1, o) for d, o in zip(shape, out4)):
                raise DoesNotFit

        def box_of(shape, blk):
            return [bk if d != 1 else 1 for d, bk in zip(shape, blk)]

        def need(blk):
            size = sum(int(np.prod(box_of(sh, blk))) * esize(bits) for _, sh, bits in ops)
            return 0, size + int(np.prod(blk)) * esize(yt["bits"]) + 3 * ALIGN

        blk = self.blocks(out4, need)
        bufs = self.buffers(*need(blk))
        at = op["attrs"]
        for start, size in _boxes(out4, blk):
            b = s.next_tile()
            at_sram = bufs[b]
            places = []
            for idx, (addr, shape, bits) in enumerate(ops):
                bx = box_of(shape, size)
                st = [st if d != 1 else 0 for st, d in zip(start, shape)]
                self.load(
                    s,
                    at_sram,
                    addr,
                    bits,
                    bx,
                    row_major(shape),
                    st,
                    wait=s.load_wait(b),
                    signal=T_IN[b] if idx == len(ops) - 1 else NO_SIGNAL,
                )
                places.append((at_sram, bx, bits))
                at_sram += _align(int(np.prod(bx)) * esize(bits))
            (pa, ba, bita), (pb, bb, bitb) = places
            args = dict(
                a=pa,
                a0=ba[0],
                a1=ba[1],
                a2=ba[2],
                a3=ba[3],
                a_bits=bita,
                b=pb,
                b0=bb[0],
                b1=bb[1],
                b2=bb[2],
                b3=bb[3],
                b_bits=bitb,
                dst=at_sram,
                o0=size[0],
                o1=size[1],
                o2=size[2],
                o3=size[3],
                out_bits=yt["bits"],
                za=at["za"],
                zb=at["zb"],
                out_zp=yt["zero_point"],
            )
            if kind == "add":
                args.update(ma=at["ma"], mb=at["mb"])
            else:
                args.update(m0=at["m0"], shift=at["shift"])
            s.emit(kind, wait=s.compute_wait(b), signal=T_DONE[b], **args)
            self.store(
                s,
                at_sram,
                self.addr[y],
                yt["bits"],
                size,
                row_major(out4),
                start,
                wait=1 << T_DONE[b],
                signal=T_STORED[b],
            )

    def add(self, s: Stream, op: dict) -> None:
        self.binary(s, op, "add")

    def mul(self, s: Stream, op: dict) -> None:
        self.binary(s, op, "mul")

    def unary(self, s: Stream, op: dict, fixed: int, instruction) -> None:
        """Tile an element-wise op of one input; `instruction(src, n, dst)` emits its compute."""
        x, y = op["inputs"][0], op["outputs"][0]
        xt, yt = self.tensors[x], self.tensors[y]
        shape = four(self.shapes[y])

        def need(blk):
            n = int(np.prod(blk))
            return fixed, _align(n * esize(xt["bits"])) + n * esize(yt["bits"])

        blk = self.blocks(shape, need)
        bufs = self.buffers(*need(blk))
        for start, size in _boxes(shape, blk):
            b = s.next_tile()
            n = int(np.prod(size))
            src, dst = bufs[b], bufs[b] + _align(n * esize(xt["bits"]))
            strides = row_major(shape)
            self.load(
                s, src, self.addr[x], xt["bits"], size, strides, start, wait=s.load_wait(b), signal=T_IN[b]
            )
            instruction(src, n, dst, wait=s.compute_wait(b), signal=T_DONE[b])
            self.store(
                s,
                dst,
                self.addr[y],
                yt["bits"],
                size,
                strides,
                start,
                wait=1 << T_DONE[b],
                signal=T_STORED[b],
            )

    def lut(self, s: Stream, op: dict) -> None:
        x, y = op["inputs"][0], op["outputs"][0]
        xt, yt = self.tensors[x], self.tensors[y]
        table = self.arrays[op["arrays"]["table"]].astype(np.int8 if yt["bits"] == 8 else np.int16)
        taddr = self.const(op["arrays"]["table"] + f"#{yt['bits']}", table)
        self.load_const(s, 0, taddr, table.nbytes)

        def compute(src, n, dst, **sync):
            s.emit(
                "lut",
                src=src,
                n=n,
                in_bits=xt["bits"],
                table=self.const_base(s),
                offset=op["attrs"]["offset"],
                dst=dst,
                out_bits=yt["bits"],
                **sync,
            )

        self.unary(s, op, table.nbytes, compute)

    def clamp(self, s: Stream, op: dict) -> None:
        bits = self.tensors[op["inputs"][0]]["bits"]

        def compute(src, n, dst, **sync):
            s.emit(
                "clamp",
                src=src,
                n=n,
                bits=bits,
                min=op["attrs"]["min"],
                max=op["attrs"]["max"],
                dst=dst,
                **sync,
            )

        self.unary(s, op, 0, compute)

    def concat(self, s: Stream, op: dict) -> None:
        y = op["outputs"][0]
        yt = self.tensors[y]
        out4 = four(self.shapes[y])
        rank = len(self.shapes[y])
        axis = op["attrs"]["axis"] % rank + (4 - rank)
        offset = 0
        for name, r in zip(op["inputs"], op["attrs"]["rescale"]):
            addr, shape, bits = self.operand(op, name, yt["bits"])

            def need(blk, bits=bits):
                n = int(np.prod(blk))
                return 0, _align(n * esize(bits)) + n * esize(yt["bits"])

            blk = self.blocks(shape, need)
            bufs = self.buffers(*need(blk))
            for start, size in _boxes(shape, blk):
                b = s.next_tile()
                n = int(np.prod(size))
                src = bufs[b]
                self.load(
                    s, src, addr, bits, size, row_major(shape), start, wait=s.load_wait(b), signal=T_IN[b]
                )
                dst = src
                if not r["same"]:
                    dst = src + _align(n * esize(bits))
                    s.emit(
                        "requant",
                        wait=s.compute_wait(b),
                        signal=T_DONE[b],
                        src=src,
                        n=n,
                        in_bits=bits,
                        in_zp=r["zin"],
                        m0=r["m0"],
                        shift=r["shift"],
                        dst=dst,
                        out_bits=yt["bits"],
                        out_zp=yt["zero_point"],
                    )
                out_start = list(start)
                out_start[axis] += offset
                self.store(
                    s,
                    dst,
                    self.addr[y],
                    yt["bits"],
                    size,
                    row_major(out4),
                    out_start,
                    wait=(1 << T_DONE[b]) | (1 << T_IN[b]),
                    signal=T_STORED[b],
                )
            offset += shape[axis]

    def gap(self, s: Stream, op: dict) -> None:
        x, y = op["inputs"][0], op["outputs"][0]
        xt, yt = self.tensors[x], self.tensors[y]
        _, c, h, w = self.shapes[x]
        xb = esize(xt["bits"])
        cb, rows = c, h
        while not self.fits(0, cb * rows * w * xb, cb * 8 + cb * 2):
            if rows > 1:
                rows = halve(rows)
            elif cb > 1:
                cb = halve(cb)
            else:
                raise DoesNotFit
        rows = -(-rows // self.split)
        bufs = self.buffers(0, cb * rows * w * xb, scratch=cb * 8 + cb * 2)
        acc = self.scratch_base()  # int64 accumulators, then the results
        at = op["attrs"]
        xs = row_major([1, c, h, w])
        for c0 in range(0, c, cb):
            c1 = min(c0 + cb, c)
            for r0 in range(0, h, rows):
                r1 = min(r0 + rows, h)
                b = s.next_tile()
                self.load(
                    s,
                    bufs[b],
                    self.addr[x],
                    xt["bits"],
                    [1, c1 - c0, r1 - r0, w],
                    xs,
                    [0, c0, r0, 0],
                    wait=s.load_wait(b),
                    signal=T_IN[b],
                )
                last = r1 == h
                s.emit(
                    "gap",
                    wait=s.compute_wait(b),
                    signal=T_DONE[b],
                    src=bufs[b],
                    c=c1 - c0,
                    hw=(r1 - r0) * w,
                    in_bits=xt["bits"],
                    in_zp=xt["zero_point"],
                    acc=acc,
                    first=int(r0 == 0),
                    last=int(last),
                    m0=at["m0"],
                    shift=at["shift"],
                    dst=acc + cb * 8,
                    out_bits=yt["bits"],
                    out_zp=yt["zero_point"],
                )
                if last:
                    self.store(
                        s,
                        acc + cb * 8,
                        self.addr[y],
                        yt["bits"],
                        [1, c1 - c0, 1, 1],
                        row_major([1, c, 1, 1]),
                        [0, c0, 0, 0],
                        wait=1 << T_DONE[b],
                        signal=T_STORED[b],
                    )

    def avgpool(self, s: Stream, op: dict) -> None:
        self.pool(s, op, maxpool=False)

    def pool(self, s: Stream, op: dict, maxpool: bool) -> None:
        x, y = op["inputs"][0], op["outputs"][0]
        xt, yt = self.tensors[x], self.tensors[y]
        _, c, h, w = self.shapes[x]
        _, _, oh, ow = self.shapes[y]
        at = op["attrs"]
        kh, kw = at["kernel_shape"]
        strides = at.get("strides") or [1, 1]
        dil = (at.get("dilations") or [1, 1]) if maxpool else [1, 1]
        pads = pool_pads([h, w], {**at, "strides": strides, "dilations": dil})
        pt, pl = pads[0], pads[1]
        xb, yb = esize(xt["bits"]), esize(yt["bits"])
        paddr = None
        if not maxpool:
            m0 = self.arrays[op["arrays"]["m0"]].astype(np.int64)
            shift = self.arrays[op["arrays"]["shift"]].astype(np.int64)
            paddr = self.const(op["arrays"]["m0"] + "#pool", np.stack([m0, shift], axis=-1))

        def span(n, st, k, d):
            return (n - 1) * st + (k - 1) * d + 1

        def sizes(cb, rows, cols):
            tile = cb * span(rows, strides[0], kh, dil[0]) * span(cols, strides[1], kw, dil[1]) * xb
            tile = _align(tile) + _align(cb * rows * cols * yb) + (0 if maxpool else rows * cols * 16)
            return 0, tile

        cb, rows, cols = c, oh, ow
        while not self.fits(*sizes(cb, rows, cols)):
            if rows > 1:
                rows = halve(rows)
            elif cb > 1:
                cb = halve(cb)
            elif cols > 1:
                cols = halve(cols)
            else:
                raise DoesNotFit
        rows = -(-rows // self.split)
        bufs = self.buffers(*sizes(cb, rows, cols))
        pad_value = qrange(xt["bits"])[0] if maxpool else xt["zero_point"]
        xs, ys = row_major([1, c, h, w]), row_major([1, c, oh, ow])
        for c0 in range(0, c, cb):
            c1 = min(c0 + cb, c)
            for r0 in range(0, oh, rows):
                r1 = min(r0 + rows, oh)
                for q0 in range(0, ow, cols):
                    q1 = min(q0 + cols, ow)
                    b = s.next_tile()
                    rows_in, top, inner_r, row0 = _window(r0, r1, strides[0], kh, dil[0], pt, h)
                    cols_in, left, inner_c, col0 = _window(q0, q1, strides[1], kw, dil[1], pl, w)
                    src = bufs[b]
                    dst = src + _align((c1 - c0) * rows_in * cols_in * xb)
                    par = dst + _align((c1 - c0) * (r1 - r0) * (q1 - q0) * yb)
                    self.load(
                        s,
                        src,
                        self.addr[x],
                        xt["bits"],
                        [1, c1 - c0, rows_in, cols_in],
                        xs,
                        [0, c0, row0, col0],
                        (top, rows_in - top - inner_r, left, cols_in - left - inner_c),
                        pad_value,
                        wait=s.load_wait(b),
                        signal=NO_SIGNAL if not maxpool else T_IN[b],
                    )
                    if not maxpool:
                        self.load(
                            s,
                            par,
                            paddr,
                            64,
                            [1, r1 - r0, q1 - q0, 2],
                            [0, ow * 2, 2, 1],
                            [0, r0, q0, 0],
                            wait=s.load_wait(b),
                            signal=T_IN[b],
                        )
                    s.emit(
                        "pool",
                        wait=s.compute_wait(b),
                        signal=T_DONE[b],
                        src=src,
                        c=c1 - c0,
                        in_h=rows_in,
                        in_w=cols_in,
                        in_bits=xt["bits"],
                        in_zp=xt["zero_point"],
                        kh=kh,
                        kw=kw,
                        sh=strides[0],
                        sw=strides[1],
                        dh=dil[0],
                        dw=dil[1],
                        mode=0 if maxpool else 1,
                        params=par if not maxpool else 0,
                        dst=dst,
                        out_h=r1 - r0,
                        out_w=q1 - q0,
                        out_bits=yt["bits"],
                        out_zp=yt["zero_point"],
                    )
                    self.store(
                        s,
                        dst,
                        self.addr[y],
                        yt["bits"],
                        [1, c1 - c0, r1 - r0, q1 - q0],
                        ys,
                        [0, c0, r0, q0],
                        wait=1 << T_DONE[b],
                        signal=T_STORED[b],
                    )

    def resize_nearest(self, s: Stream, op: dict) -> None:
        x, y = op["inputs"][0], op["outputs"][0]
        xt = self.tensors[x]
        bits = xt["bits"]
        _, c, h, w = self.shapes[x]
        _, _, oh, ow = self.shapes[y]
        at = op["attrs"]
        row_idx = nearest_indices(h, oh, at) if h != oh else np.arange(h)
        col_idx = nearest_indices(w, ow, at) if w != ow else np.arange(w)
        e = esize(bits)

        def sizes(cb, rows):
            worst = max(
                int(row_idx[min(r + rows, oh) - 1] - row_idx[r] + 1) if oh else 1 for r in range(0, oh, rows)
            )
            return 0, _align(cb * worst * w * e) + _align(cb * rows * ow * e) + (rows + ow) * 4

        cb, rows = c, oh
        while not self.fits(*sizes(cb, rows)):
            if rows > 1:
                rows = halve(rows)
            elif cb > 1:
                cb = halve(cb)
            else:
                raise DoesNotFit
        rows = -(-rows // self.split)
        bufs = self.buffers(*sizes(cb, rows))
        xs, ys = row_major([1, c, h, w]), row_major([1, c, oh, ow])
        for r0 in range(0, oh, rows):
            r1 = min(r0 + rows, oh)
            lo, hi = int(row_idx[r0:r1].min()), int(row_idx[r0:r1].max())
            index = np.concatenate([row_idx[r0:r1] - lo, col_idx]).astype(np.int32)
            iaddr = self.const(f"{op['node']}#resize{r0}", index)
            for c0 in range(0, c, cb):
                c1 = min(c0 + cb, c)
                b = s.next_tile()
                src = bufs[b]
                dst = src + _align((c1 - c0) * (hi - lo + 1) * w * e)
                idx_at = dst + _align((c1 - c0) * (r1 - r0) * ow * e)
                self.load(
                    s,
                    src,
                    self.addr[x],
                    bits,
                    [1, c1 - c0, hi - lo + 1, w],
                    xs,
                    [0, c0, lo, 0],
                    wait=s.load_wait(b),
                )
                self.load(
                    s,
                    idx_at,
                    iaddr,
                    32,
                    [1, 1, 1, index.size],
                    [0, 0, 0, 1],
                    [0, 0, 0, 0],
                    wait=s.load_wait(b),
                    signal=T_IN[b],
                )
                s.emit(
                    "resize",
                    wait=s.compute_wait(b),
                    signal=T_DONE[b],
                    src=src,
                    c=c1 - c0,
                    in_h=hi - lo + 1,
                    in_w=w,
                    bits=bits,
                    index=idx_at,
                    dst=dst,
                    out_h=r1 - r0,
                    out_w=ow,
                )
                self.store(
                    s,
                    dst,
                    self.addr[y],
                    bits,
                    [1, c1 - c0, r1 - r0, ow],
                    ys,
                    [0, c0, r0, 0],
                    wait=1 << T_DONE[b],
                    signal=T_STORED[b],
                )

    # data movement -----------------------------------------------------------------------------
    def copy_op(self, s: Stream, op: dict) -> None:
        """Transpose, Slice and Split: strided DMA reads of the input, contiguous writes."""
        x = op["inputs"][0]
        in_shape = [int(d) for d in self.shapes[x]]
        rank = len(in_shape)
        in_strides = row_major(four(in_shape))[4 - rank :]
        kind = op["op_type"]
        if kind == "Transpose":
            perm = op["attrs"].get("perm") or list(range(rank))[::-1]
            y = op["outputs"][0]
            self.copy(s, x, y, [in_strides[p] for p in perm], 0)
        elif kind == "Slice":
            consts = [
                self.arrays[op["constants"][i]] if i in op["constants"] else None for i in op["inputs"][1:]
            ]
            starts, ends = consts[0], consts[1]
            axes = consts[2] if len(consts) > 2 and consts[2] is not None else range(len(starts))
            steps = slice_steps(op, self.arrays)
            if len(steps) != len(starts):
                steps = [1] * len(starts)
            strides, origin = list(in_strides), 0
            for st, en, ax, sp in zip(starts, ends, axes, steps):
                ax = int(ax) % rank
                begin, _, step = slice(int(st), int(en), int(sp)).indices(in_shape[ax])
                strides[ax] = in_strides[ax] * step
                origin += begin * in_strides[ax]
            self.copy(s, x, op["outputs"][0], strides, origin)
        elif kind == "Split":
            axis = op["attrs"].get("axis", 0) % rank
            origin = 0
            for out in op["outputs"]:
                self.copy(s, x, out, list(in_strides), origin)
                origin += int(self.shapes[out][axis]) * in_strides[axis]
        else:
            raise DoesNotFit

    def copy(self, s: Stream, x: str, y: str, src_strides: list[int], origin: int) -> None:
        bits = self.tensors[x]["bits"]
        out = four(self.shapes[y])
        src = [0] * (4 - len(src_strides)) + list(src_strides)
        e = esize(bits)
        blk = self.blocks(out, lambda b: (0, int(np.prod(b)) * e))
        bufs = self.buffers(0, int(np.prod(blk)) * e)
        for start, size in _boxes(out, blk):
            b = s.next_tile()
            self.load(
                s,
                bufs[b],
                self.addr[x] + origin * e,
                bits,
                size,
                src,
                start,
                wait=s.load_wait(b),
                signal=T_IN[b],
            )
            self.store(
                s,
                bufs[b],
                self.addr[y],
                bits,
                size,
                row_major(out),
                start,
                wait=1 << T_IN[b],
                signal=T_STORED[b],
            )


def _first_fit(live: list[tuple[int, int, int]], size: int) -> int:
    """The lowest offset where `size` bytes fit between the live (end, start, size) buffers."""
    start = 0
    for _, s0, sz in sorted(live, key=lambda b: b[1]):
        if start + size <= s0:
            break
        start = max(start, s0 + sz)
    return start


def _space(address: int) -> tuple[int, int]:
    """(memory space, address): resident tensors carry SRAM_FLAG in their address."""
    return (1, address - SRAM_FLAG) if address >= SRAM_FLAG else (0, address)


def _window(o0: int, o1: int, stride: int, k: int, d: int, pad: int, size: int) -> tuple[int, int, int, int]:
    """Input extent of output positions [o0, o1): (positions incl. padding, leading padding,
    positions inside the tensor, first position inside the tensor)."""
    begin = o0 * stride - pad
    end = (o1 - 1) * stride - pad + (k - 1) * d + 1
    total = end - begin
    inside = max(0, min(end, size) - max(begin, 0))
    lead = min(max(0, -begin), total)
    first = min(max(begin, 0), max(size - 1, 0))
    return total, lead, inside, first


def _boxes(shape4: list[int], blk: list[int]):
    """(start, size) of every tile of a 4-D box."""
    ranges = [range(0, d, b) for d, b in zip(shape4, blk)]
    for s0 in ranges[0]:
        for s1 in ranges[1]:
            for s2 in ranges[2]:
                for s3 in ranges[3]:
                    start = [s0, s1, s2, s3]
                    yield start, [min(b, d - st) for st, b, d in zip(start, blk, shape4)]
