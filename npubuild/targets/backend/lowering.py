"""Lowering: the tile command stream -> synchronised instructions.

Tokens (docs/npu.md): 0 constants loaded; 1/2 input tile in buffer A/B; 3/4 computed into A/B;
5/6 stored from A/B; with two constant slots, slot 1's constant loads signal 7. A wait names the
most recent signal of a token before it in the stream. Tiles alternate between the two buffers
(ping-pong), so the load of tile t+1 waits only for the store that last used its buffer, and
overlaps the computation of tile t.

An op of one tile whose input or output is contiguous bytes of a resident tensor (a whole tensor,
or whole channels of one) reads or writes them where they live: the on-chip copy into or out of
its tile buffer is dropped and the compute's operand is the resident address (in_place.py). An
op's first instructions then wait for the op before it to have computed as well as stored, since
such an op signals no store. An op of several tiles does the same tile by tile (a fully-connected
layer's 256 weight chunks each copied the whole 18 KB input into a tile buffer: ZFNet-512's FC6,
75k cycles of copies), except that no tile reads in place bytes one of the op's tiles stores: a
tile without loads waits as its loads would have (the first two for everything before the op, the
others for the store that last used their buffer), and a tile without a store holds its buffer
until its compute ends (`unstored`).

With fresh constants (`fresh`: the grouping search's `fresh_constants`, where a subgraph's
constants all fit one area of SRAM), the two slots are that one area and each group takes the
next bytes of it: no group overwrites another, so no constant load waits for a compute, and a
group may load any time before its op. Where in the in-order DMA queue each goes is then chosen
by the estimate (`_late_anchors`).

An op whose constants take the DMA longer to load than the op takes to compute (a squeeze-excite
convolution on a 1 x 1 map: ten cycles of MACs on 10 KB of weights) may join the constant group
still open, in the same slot after its constants, where they fit (`_joining_offset`): the group
is hoisted as a whole, so its weights load while the ops before the group compute, where alone
they would load while the op just before it, as short, computes. But the group's first op then
waits for all of the group's loads, and the DMA queue is in order (a long constant load holds back
the tile loads behind it), so the op joins only where the stream so far, hoisted, is estimated to
end sooner with it joined than alone (`add_op`).
"""

from __future__ import annotations

import bisect
import copy
import dataclasses

from npubuild.intmodel.program import Op
from npubuild.targets.backend.commands import (
    Command,
    ConstLoads,
    InConst,
    InTile,
    Step,
    Tile,
    box_bytes,
    is_pinned,
)
from npubuild.targets.backend.in_place import in_place
from npubuild.targets.backend.memory import DoesNotFit, SramPlan, align
from npubuild.targets.cycles import cost, end_cycle
from npubuild.targets.isa import (
    NO_SIGNAL,
    Instruction,
    far_span,
)

T_CONST, T_IN, T_DONE, T_STORED = 0, (1, 2), (3, 4), (5, 6)
SLOT_TOKENS = (0, 7)  # the token each constant slot's loads signal
EARLY_GROUPS = 8  # how many groups back a group of pinned tables may be hoisted (`_early_anchors`)
LATE_PASSES = 2  # passes of `_late_anchors` over the groups
LATE_PLACES = 16  # how many input loads before a fresh group it is tried after (`_late_anchors`)
START = -1  # a group's place before the stream's first instruction (`_late_anchors`)


class Lowering:
    """Lowers one NPU subgraph's ops in order; `finish` hoists constants and ends the stream."""

    def __init__(
        self,
        sram: SramPlan,
        slot: int = 1,
        const_token: int = T_CONST,
        target: dict | None = None,
        join: bool = False,
        fresh: bool = False,
    ):
        self.sram = sram
        # with `fresh`, the two slots are one area that the groups fill in order, each in bytes
        # of its own (module docstring); `fresh_base` is the open group's place in it
        self.fresh = fresh
        self.fresh_base = 0
        self.fresh_end = 0
        self.target = target  # to cost an op's constant loads against its computes
        self.join = join  # whether weight-bound ops may join the open constant group
        self.code: list[Instruction] = []
        self.marks: list[tuple[int, Op]] = []  # (first instruction, op)
        self.slot = slot  # the constant slot the last group used
        self.const_token = const_token
        self.groups: list[list[int]] = []  # instruction indices of each constant group (with slots)
        self.pinned_groups: set[int] = set()  # the groups that load pinned tables only (pinning.py)
        self.group_tokens: list[int] = []  # the token each group's loads signal, as emitted
        self.first_input: list[int | None] = []  # the first tile's input load after each group
        self.compute_anchors: set[int] = set()  # first_input entries that are computes (no load)
        self.hoisted_before: dict[int, int] = {}  # such a compute -> the constant loads put before it
        self.in_group = False
        self.group_end = 0  # the bytes of its slot the open constant group fills
        self.const_shift = 0  # where this op's constants start in the group they joined
        self.pinned: set[int] = set()  # SRAM addresses of the pinned tables loaded so far
        self.unstored = [False, False]  # per tile buffer: whether its last tile stored nothing
        self.input_loads: list[int] = []  # every tile's input load (later places for a group)

    def trial(self) -> Lowering:
        """An empty stream in this one's constant state: to cost an op's alternatives."""
        trial = Lowering(self.sram, self.slot, self.const_token, fresh=self.fresh)
        trial.pinned = set(self.pinned)
        trial.fresh_base, trial.fresh_end = self.fresh_base, self.fresh_end
        return trial

    def add_op(self, op: Op, commands: list[Command]) -> None:
        commands = self._unpinned(commands)
        tiles = [c for c in commands if isinstance(c, Tile)]
        if len(tiles) == 1:
            commands = [in_place(c) if isinstance(c, Tile) else c for c in commands]
        elif tiles:
            # the resident bytes the op's tiles write (stores of space 1): no tile reads those in place
            written = [
                far_span(t.store.args, "dram") for t in tiles if t.store and t.store.args["space"] == 1
            ]
            commands = [in_place(c, written) if isinstance(c, Tile) else c for c in commands]
        joining = self._joining_offset(commands)
        if joining is None:
            self._add(op, commands, None)
            return
        joined, alone = self._copy(), self._copy()
        joined._add(op, commands, joining)
        alone._add(op, commands, None)
        self.__dict__.update((joined if joined._cycles() < alone._cycles() else alone).__dict__)

    def _unpinned(self, commands: list[Command]) -> list[Command]:
        """The commands without the loads of pinned tables (pinning.py) an op before loaded: a
        pinned table's load names its SRAM address, not a place in the constant area."""
        kept = []
        for command in commands:
            if isinstance(command, ConstLoads) and command.loads:
                pinned = {s.args["sram"] for s in command.loads if is_pinned(s)}
                if pinned and pinned <= self.pinned:
                    continue
                self.pinned |= pinned
            kept.append(command)
        return kept

    def _copy(self) -> Lowering:
        """This stream with its own lists (instructions are not changed once emitted)."""
        twin = copy.copy(self)
        twin.code, twin.marks, twin.first_input = list(self.code), list(self.marks), list(self.first_input)
        twin.groups = [list(g) for g in self.groups]
        twin.pinned_groups = set(self.pinned_groups)
        twin.group_tokens = list(self.group_tokens)
        twin.compute_anchors, twin.hoisted_before = set(self.compute_anchors), dict(self.hoisted_before)
        twin.unstored = list(self.unstored)
        twin.input_loads = list(self.input_loads)
        return twin

    def _cycles(self) -> int:
        """The estimated end of the stream so far, its constant groups hoisted."""
        code = self._arranged({})[0] if self.sram.const_slot else self.code
        return end_cycle(code, self.target)

    def _add(self, op: Op, commands: list[Command], joining: int | None) -> None:
        self.marks.append((len(self.code), op))
        self.const_shift = joining or 0
        tile = 0
        chunk_tile = 0  # tiles since the op's last constant group (a weight chunk's tiles)
        buffers = None
        first_loads_end = None  # where a chunk's first tile's loads end, while its second may join them
        for command in commands:
            if isinstance(command, ConstLoads):
                for k, step in enumerate(command.loads):
                    self._const(step, last=k == len(command.loads) - 1, join=joining is not None)
                first_loads_end = None
                chunk_tile = 0
                continue
            b = tile % 2
            tile += 1
            chunk_tile += 1
            # a tile in other buffers than the tile before (a Concat tiles each input its own
            # way) may overlap either of the old ones: it waits as an op's first tiles do
            start = len(self.code)
            self._tile(command, b, first_two=tile <= 2 or command.buffers != buffers)
            if (
                chunk_tile == 2
                and first_loads_end is not None
                and command.buffers == buffers
                and command.loads
            ):
                self._hoist_second_loads(first_loads_end, start, len(command.loads))
            first_loads_end = start + len(command.loads) if chunk_tile == 1 and command.loads else None
            buffers = command.buffers

    def _joining_offset(self, commands: list[Command]) -> int | None:
        """Where in the open constant group's slot the op's constants would go if they joined it
        (module docstring): an op with one constant group, first, on a stream with slots, whose
        loads cost more cycles than its computes and fit the slot after the group's."""
        if not (self.join and self.sram.const_slot and self.target and self.groups and commands):
            return None
        if len(self.groups) - 1 in self.pinned_groups:
            return None  # the open group is a pinned table's: the slot's group is not open
        groups = [c for c in commands if isinstance(c, ConstLoads)]
        if len(groups) != 1 or commands[0] is not groups[0]:
            return None
        loads = groups[0].loads
        if any(is_pinned(step) for step in loads):
            return None  # a pinned table's load writes no slot
        at = align(self.group_end)
        room = 2 * self.sram.const_slot - self.fresh_base if self.fresh else self.sram.const_slot
        if at + max(step.args["sram"].offset + box_bytes(step) for step in loads) > room:
            return None
        loading = sum(cost(Instruction(step.op, step.args), self.target) for step in loads)
        computing = sum(
            cost(Instruction(c.compute.op, c.compute.args), self.target)
            for c in commands
            if isinstance(c, Tile) and c.compute is not None
        )
        return at if computing < loading else None

    def _const(self, step: Step, last: bool, join: bool = False) -> None:
        """A constant load waits until the tiles that read the slot's last contents are done
        (without slots, stored too). With slots, each group takes the other slot, unless the op
        joins the open group (`_joining_offset`). A pinned table's load (pinning.py) writes no
        slot: no op's tiles or constants lie where it lands, so it waits for nothing, and it is a
        group of its own that takes no turn of the slots (it signals the open slot's token, which
        its readers wait for: a later load of the same token ends after it, the DMA queue being
        in order) and may be hoisted further (`_early_anchors`)."""
        pinned = is_pinned(step)
        if self.sram.const_slot and not join:
            open_pinned = self.in_group and len(self.groups) - 1 in self.pinned_groups
            if not self.in_group or (open_pinned and not pinned):
                if not pinned:
                    self.slot ^= 1
                    self.const_token = SLOT_TOKENS[self.slot]
                    self.group_end = 0
                    self.fresh_base = align(self.fresh_end)
                self.groups.append([])
                self.first_input.append(None)
                self.group_tokens.append(self.const_token)
                if pinned:
                    self.pinned_groups.add(len(self.groups) - 1)
        at = len(self.code)
        wait = (1 << T_DONE[0]) | (1 << T_DONE[1])
        if pinned or self.fresh:
            wait = 0  # SRAM no other instruction of the program touches: only the DMA queue orders it
        elif not self.sram.const_slot:
            # one area for constants and tiles: this op's constants land where the op before kept
            # its tiles, so they also wait for its stores to have read them out (hazards.py)
            wait |= (1 << T_STORED[0]) | (1 << T_STORED[1])
        self._emit(step, None, wait, self.const_token if last else NO_SIGNAL)
        if self.sram.const_slot:
            self.groups[-1].append(at)
            self.in_group = True
            if not pinned:
                end = self.const_shift + step.args["sram"].offset + box_bytes(step)
                self.group_end = max(self.group_end, end)
                if self.fresh:
                    self.fresh_end = max(self.fresh_end, self.fresh_base + end)
                    if self.fresh_end > 2 * self.sram.const_slot:
                        raise DoesNotFit  # the subgraph's constants outgrow the area

    def _tile(self, tile: Tile, b: int, first_two: bool) -> None:
        buffer = tile.buffers[b]
        # the buffer's previous tile must be stored (so computed too); an op's first tiles also
        # wait for the op before it to finish writing (its stores, or its computes where it
        # wrote a resident tensor in place)
        before = (1 << T_STORED[0]) | (1 << T_STORED[1]) | (1 << T_DONE[0]) | (1 << T_DONE[1])
        load_wait = before if first_two else 1 << T_STORED[b]
        if not first_two and self.unstored[b]:
            # the buffer's previous tile stored nothing (a global pool's tiles accumulate): its
            # compute is what last read the buffer (hazards.py found the loads of a vnpu-s pool
            # overwriting a tile its compute still read)
            load_wait |= 1 << T_DONE[b]
        for k, step in enumerate(tile.loads):
            self._emit(step, buffer, load_wait, T_IN[b] if k == len(tile.loads) - 1 else NO_SIGNAL)
        if tile.compute is not None:
            wait = (1 << T_IN[b]) | (1 << T_STORED[b]) | (1 << self.const_token)
            if not tile.loads:  # its inputs in place: it waits as its loads would have
                wait |= load_wait
                if self.first_input and self.first_input[-1] is None:
                    self.first_input[-1] = len(self.code)
                    self.compute_anchors.add(len(self.code))
            self._emit(tile.compute, buffer, wait, T_DONE[b])
        self.unstored[b] = tile.compute is not None and tile.store is None
        if tile.store is not None:
            # a tile that is only a store (of resident bytes: emit_data) waits as its loads would
            wait = load_wait if not tile.loads and tile.compute is None else 0
            if "compute" in tile.store_after:
                wait |= 1 << T_DONE[b]
            if "load" in tile.store_after:
                wait |= 1 << T_IN[b]
            self._emit(tile.store, buffer, wait, T_STORED[b])

    def _hoist_second_loads(self, to: int, start: int, count: int) -> None:
        """Move the op's second tile's loads up to just after its first tile's. They wait for
        everything before the op (its first two tiles' rule), and a wait names the latest signal
        before it in the stream: after the first tile's compute and store they would wait for
        those too, and the op's first two tiles would run one after the other. Before them, the
        second tile loads into the other buffer while the first computes."""
        self.code[to:to] = self.code[start : start + count]
        del self.code[start + count : start + 2 * count]
        # (input_loads is sorted: only its entries from `to` to the moved loads' end change)
        loads = self.input_loads
        lo, hi = bisect.bisect_left(loads, to), bisect.bisect_left(loads, start + count)
        loads[lo:hi] = sorted(i + count if i < start else to + i - start for i in loads[lo:hi])
        if self.first_input and self.first_input[-1] == to - 1:
            # the next constant group goes after both tiles' loads: before the second's, the
            # DMA queue (in order) would hold the second tile back by the constants' time
            self.first_input[-1] = to + count - 1

    def _emit(self, step: Step, buffer: int | None, wait: int, signal: int) -> None:
        const_base = self.slot * self.sram.const_slot if self.sram.const_slot else 0
        if self.fresh:
            const_base = self.fresh_base
        args = dict(step.args)
        for name, value in args.items():
            if type(value) is int:  # most operands: tested first, as this runs for every step of every trial
                continue
            if isinstance(value, InTile):
                args[name] = buffer + value.offset
            elif isinstance(value, InConst):
                args[name] = const_base + self.const_shift + value.offset
        if step.op == "load" and signal in T_IN and self.first_input and self.first_input[-1] is None:
            self.first_input[-1] = len(self.code)
        if step.op == "load" and signal in T_IN:
            self.input_loads.append(len(self.code))
        self.in_group = False
        self.code.append(Instruction(step.op, args, wait, signal))

    def finish(self) -> tuple[list[Instruction], list[tuple[int, Op]]]:
        """The instructions, ending with `end`, and each op's first instruction."""
        marks = self.marks
        if self.sram.const_slot:
            position, moved = self._hoist_constants()
            marks = [(_first_kept(at, position, moved, self.hoisted_before), op) for at, op in marks]
        self.code.append(Instruction("end", {}))
        return self.code, marks

    def _hoist_constants(self) -> tuple[list[int], set[int]]:
        """Move each constant group up (`_hoisted_order`, with `_early_anchors`). Returns each old
        index's new one and the old indices that moved."""
        early = self._early_anchors()
        self.code, order, moved, self.hoisted_before = self._arranged(early, self._late_anchors(early))
        position = [0] * len(order)
        for new, old in enumerate(order):
            position[old] = new
        return position, moved

    def _early_anchors(self) -> dict[int, int]:
        """For each group of pinned tables, the group whose first input load it goes after: the
        one the estimate finds the stream ends soonest with, from the group before it back to
        `EARLY_GROUPS` before (greedily, in stream order). A 16-bit table takes the DMA thousands
        of cycles (Silero VAD's square root: 1,794), which the op before it, a short lookup or an
        Add, cannot hide; its SRAM is its own for the whole program, so it may load while a
        convolution several ops earlier computes (the DMA queue is in order, so not so early that
        it holds back the tile loads the array waits for)."""
        chosen: dict[int, int] = {}
        if not self.target:
            return chosen
        slotted = [k for k in range(len(self.groups)) if k not in self.pinned_groups]
        for j in sorted(self.pinned_groups):
            earlier = [k for k in reversed(slotted) if k < j][:EARLY_GROUPS]
            candidates = [k for k in earlier if self._anchor(k, j)]
            if len(candidates) < 2:
                continue
            chosen[j] = min(candidates, key=lambda k, j=j: (self._ends({**chosen, j: k}), -k))
        return chosen

    def _late_anchors(self, early: dict[int, int]) -> dict[int, int]:
        """With fresh constants, the place of each group in the stream: the start, or after an
        input load before the group, back to the first input load of the slots' group
        `EARLY_GROUPS` before it (up to `LATE_PLACES` of them, evenly spaced), where the
        estimate finds the stream ends sooner than at `_hoisted_order`'s place for it; each
        group in stream order given the others' places, in `LATE_PASSES` passes. A fresh group
        waits for nothing, so it may go anywhere before its op; what decides is the DMA queue,
        which is in order: hoisted after the first input load of the group before (the slots'
        rule), Silero VAD's 64 KiB square root table held its STFT convolution's third tile
        load back by 2,198 cycles, where after the fourth it still loads before the square root
        runs; and its first encoder's weights, which nothing but the STFT's loads can go ahead
        of, want to be as early as they can. (With slots a group cannot go earlier than that
        rule's place, and later would hold the slot's next group back as well: not tried.) A
        group of pinned tables placed before its anchor group keeps the token `_arranged` gives
        it against that anchor's: an op between that waits for the same token then waits for
        the table too, a delay the estimate sees (a wait names the latest signal, and the DMA
        queue is in order), never a hazard."""
        chosen: dict[int, int] = {}
        if not (self.fresh and self.target):
            return chosen
        for _ in range(LATE_PASSES):
            self._late_pass(early, chosen)
        return chosen

    def _late_pass(self, early: dict[int, int], chosen: dict[int, int]) -> None:
        """One pass of `_late_anchors` over the groups in stream order, each placed given the
        places of the others in `chosen` (updated)."""
        slotted: list[int] = []
        for j in range(len(self.groups)):
            chosen.pop(j, None)
            if not self.groups[j]:
                continue
            last = slotted[-1] if slotted else -1
            k = early.get(j, last) if j in self.pinned_groups else last  # `_hoisted_order`'s anchor
            back = slotted[-EARLY_GROUPS] if len(slotted) >= EARLY_GROUPS else None
            floor = self.first_input[back] if back is not None else None
            floor = START if floor is None else floor
            places = [x for x in self.input_loads if floor <= x < self.groups[j][0]]
            places = ([START] if floor == START else []) + _spread(places, LATE_PLACES)
            default = self.first_input[k] if self._anchor(k, j) else None
            stay = self._ends(early, chosen) if default is None else None
            ends = {x: self._ends(early, {**chosen, j: x}) for x in places if x != default}
            if default is not None:
                ends[default] = self._ends(early, {**chosen, j: default})
            best = min(ends, key=lambda x: (ends[x], x != default, -x), default=None)
            if best is not None and (stay is None or ends[best] < stay):
                chosen[j] = best
            if j not in self.pinned_groups:
                slotted.append(j)

    def _ends(self, early: dict[int, int], late: dict[int, int] | None = None) -> int:
        """The estimated end of the stream with its groups hoisted, pinned ones as `early` says
        and slots' groups as `late` says."""
        return end_cycle(self._arranged(early, late)[0], self.target)

    def _arranged(
        self, early: dict[int, int], late: dict[int, int] | None = None
    ) -> tuple[list[Instruction], list[int], set[int], dict[int, int]]:
        """The instructions in their hoisted order (`_hoisted_order`), with each group of pinned
        tables moved after group k's first input load signalling the slot token k's op does not
        wait for (the other one), and its readers waiting for that token as well: signalling
        k's, it would hold k's computes back by the table's load. A wait names the latest signal
        of a token before it, which is the table's or a later load's (the DMA queue is in order).
        Also the order, the moved indices and the compute anchors' counts."""
        order, moved, before, anchors = self._hoisted_order(early, late or {})
        code = list(self.code)
        starts = sorted(at for at, _ in self.marks)
        for j, k in anchors.items():
            if j not in self.pinned_groups:
                continue
            token, other = self.group_tokens[j], SLOT_TOKENS[1 - SLOT_TOKENS.index(self.group_tokens[k])]
            if token == other:
                continue
            group = self.groups[j]
            end = next((at for at in starts if at > group[-1]), len(code))  # the reader's instructions
            for i in group:
                if code[i].signal == token:
                    code[i] = dataclasses.replace(code[i], signal=other)
            for i in range(group[-1] + 1, end):
                if code[i].wait >> token & 1:
                    code[i] = dataclasses.replace(code[i], wait=code[i].wait | 1 << other)
        return [code[i] for i in order], order, moved, before

    def _anchor(self, k: int, j: int) -> bool:
        """Whether group j may go after group k's first input load."""
        anchor = self.first_input[k] if k >= 0 else None
        return anchor is not None and anchor < self.groups[j][0]

    def _hoisted_order(
        self, early: dict[int, int], late: dict[int, int]
    ) -> tuple[list[int], set[int], dict[int, int], dict[int, int]]:
        """The stream's order with each constant group moved up to just after the first input
        load of the slots' group before it (a group of pinned tables: of the group `early` names,
        else of the slots' group before as well), so the DMA fetches the next weights while the
        MAC array works on the current ones. Safe: a group writes the slot the slots' group two
        back read, and its wait names the computes before its new place, which include every tile
        of that group; a pinned table writes SRAM of its own. Also the old indices that moved,
        for a compute anchor how many loads went before it, and each moved group's anchor group."""
        moves: dict[int, list[int]] = {}
        anchors: dict[int, int] = {}
        slotted = -1  # the last group that took a turn of the slots
        for j in range(len(self.groups)):
            k = early.get(j, slotted) if j in self.pinned_groups else slotted
            if self._anchor(k, j):
                moves.setdefault(late.get(j, self.first_input[k]), []).extend(self.groups[j])
                anchors[j] = k
            elif j in late:  # a place of `_late_anchors` where this rule has none
                moves.setdefault(late[j], []).extend(self.groups[j])
            if j not in self.pinned_groups:
                slotted = j
        moved = {i for group in moves.values() for i in group}
        order: list[int] = []
        before: dict[int, int] = dict(self.hoisted_before)
        order.extend(moves.get(START, []))
        for i in range(len(self.code)):
            if i in moved:
                continue
            # after an input load, or before a compute that reads its input in place: either
            # way the group's wait names the computes of the group before, as before the move
            if i in self.compute_anchors:
                order.extend(moves.get(i, []))
                order.append(i)
                before[i] = len(moves.get(i, []))
            else:
                order.append(i)
                order.extend(moves.get(i, []))
        return order, moved, before, anchors


def _first_kept(at: int, position: list[int], moved: set[int], before: dict[int, int]) -> int:
    """Where an op's first instruction that stayed in place went (its start after hoisting). The
    constant loads hoisted to just before an op's compute (an op without input loads) belong to
    that op, as those hoisted after an op's first input load do."""
    while at < len(position) and at in moved:
        at += 1
    if at in before:
        return position[at] - before[at]
    return position[at] if at < len(position) else len(position)


def _spread(items: list[int], count: int) -> list[int]:
    """Up to `count` of `items`, evenly spaced, the last among them."""
    step = max(1, -(-len(items) // count))
    return items[::-1][::step][::-1]
