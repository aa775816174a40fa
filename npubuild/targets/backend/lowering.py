"""Lowering: the tile command stream -> synchronised instructions.

Tokens (docs/npu.md): 0 constants loaded; 1/2 input tile in buffer A/B; 3/4 computed into A/B;
5/6 stored from A/B; with two constant slots, slot 1's constant loads signal 7. A wait names the
most recent signal of a token before it in the stream. Tiles alternate between the two buffers
(ping-pong), so the load of tile t+1 waits only for the store that last used its buffer, and
overlaps the computation of tile t.
"""

from __future__ import annotations

from npubuild.intmodel.program import Op
from npubuild.targets.backend.commands import Command, ConstLoads, InConst, InTile, Step, Tile
from npubuild.targets.backend.memory import SramPlan
from npubuild.targets.isa import NO_SIGNAL, Instruction

T_CONST, T_IN, T_DONE, T_STORED = 0, (1, 2), (3, 4), (5, 6)
SLOT_TOKENS = (0, 7)  # the token each constant slot's loads signal


class Lowering:
    """Lowers one NPU subgraph's ops in order; `finish` hoists constants and ends the stream."""

    def __init__(self, sram: SramPlan, slot: int = 1, const_token: int = T_CONST):
        self.sram = sram
        self.code: list[Instruction] = []
        self.marks: list[tuple[int, Op]] = []  # (first instruction, op)
        self.slot = slot  # the constant slot the last group used
        self.const_token = const_token
        self.groups: list[list[int]] = []  # instruction indices of each constant group (with slots)
        self.first_input: list[int | None] = []  # the first tile's input load after each group
        self.in_group = False

    def trial(self) -> Lowering:
        """An empty stream in this one's constant state: to cost an op's alternatives."""
        return Lowering(self.sram, self.slot, self.const_token)

    def add_op(self, op: Op, commands: list[Command]) -> None:
        self.marks.append((len(self.code), op))
        tile = 0
        for command in commands:
            if isinstance(command, ConstLoads):
                for k, step in enumerate(command.loads):
                    self._const(step, last=k == len(command.loads) - 1)
                continue
            b = tile % 2
            tile += 1
            self._tile(command, b, first_two=tile <= 2)

    def _const(self, step: Step, last: bool) -> None:
        """A constant load waits until the tiles that read the slot's last contents are done.
        With slots, each group takes the other slot."""
        if self.sram.const_slot and not self.in_group:
            self.slot ^= 1
            self.const_token = SLOT_TOKENS[self.slot]
            self.groups.append([])
            self.first_input.append(None)
        at = len(self.code)
        wait = (1 << T_DONE[0]) | (1 << T_DONE[1])
        self._emit(step, None, wait, self.const_token if last else NO_SIGNAL)
        if self.sram.const_slot:
            self.groups[-1].append(at)
            self.in_group = True

    def _tile(self, tile: Tile, b: int, first_two: bool) -> None:
        buffer = tile.buffers[b]
        # the buffer's previous tile must be stored (so computed too); an op's first tiles also
        # wait for the op before it to finish writing DRAM
        load_wait = (1 << T_STORED[0]) | (1 << T_STORED[1]) if first_two else 1 << T_STORED[b]
        for k, step in enumerate(tile.loads):
            self._emit(step, buffer, load_wait, T_IN[b] if k == len(tile.loads) - 1 else NO_SIGNAL)
        if tile.compute is not None:
            wait = (1 << T_IN[b]) | (1 << T_STORED[b]) | (1 << self.const_token)
            self._emit(tile.compute, buffer, wait, T_DONE[b])
        if tile.store is not None:
            wait = 0
            if "compute" in tile.store_after:
                wait |= 1 << T_DONE[b]
            if "load" in tile.store_after:
                wait |= 1 << T_IN[b]
            self._emit(tile.store, buffer, wait, T_STORED[b])

    def _emit(self, step: Step, buffer: int | None, wait: int, signal: int) -> None:
        const_base = self.slot * self.sram.const_slot if self.sram.const_slot else 0
        args = {}
        for name, value in step.args.items():
            if isinstance(value, InTile):
                value = buffer + value.offset
            elif isinstance(value, InConst):
                value = const_base + value.offset
            args[name] = value
        if step.op == "load" and signal in T_IN and self.first_input and self.first_input[-1] is None:
            self.first_input[-1] = len(self.code)
        self.in_group = False
        self.code.append(Instruction(step.op, args, wait, signal))

    def finish(self) -> tuple[list[Instruction], list[tuple[int, Op]]]:
        """The instructions, ending with `end`, and each op's first instruction."""
        marks = self.marks
        if self.sram.const_slot:
            position, moved = self._hoist_constants()
            marks = [(_first_kept(at, position, moved), op) for at, op in marks]
        self.code.append(Instruction("end", {}))
        return self.code, marks

    def _hoist_constants(self) -> tuple[list[int], set[int]]:
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


def _first_kept(at: int, position: list[int], moved: set[int]) -> int:
    """Where an op's first instruction that stayed in place went (its start after hoisting)."""
    while at < len(position) and at in moved:
        at += 1
    return position[at] if at < len(position) else len(position)
