"""The splits `pipeline.choose_split` found, reused across the grouping search's compiles.

choose_split emits an op at every split of its tile and costs each in a trial stream: 69% of a
compile of PP-OCRv4 det, whose grouping search compiles the network 150-260 times, and most ops of
most of those compiles are the same op in the same setting. The memo keys a choice by everything
the trials read, so a reused split is the split the trials would find:

- the op and the ops fused into it, the model's tensors and arrays (by identity: the memo keeps
  them alive, so no id is reused while it lives);
- the op's schedule at every split and whether each one's tile buffers fit the SRAM plan (the
  SRAM plan decides nothing else that a trial's cost reads: buffer addresses do not count);
- for every tensor the op's commands read or write: its shape, window, shuffle and upsample and
  its address, relative to the lowest of the op's addresses in the same memory (DRAM addresses
  move with the allocation and resident ones with the budget; only their order and distance
  decide anything: a Concat written in place, a tile that reads resident bytes where they lie);
- the pinned tables, and of the trial stream whether it has constant slots, a fresh constant
  area, and which pinned tables it holds. Which of the two slots is open is left out: the
  trial's cycles are the same either way (the tokens swap names), only SRAM addresses differ.
  A fresh area's fill is left out too, but a split is reused only where the area has at least
  the room the trials took (past it a trial raises DoesNotFit and the compile ends).

tests/test_split_memo.py compiles with a memo that runs every trial and checks each repeated key's
split against the first."""

from __future__ import annotations

from npubuild.intmodel.program import Op
from npubuild.targets.backend.context import OpContext
from npubuild.targets.backend.lowering import Lowering
from npubuild.targets.backend.memory import align, space
from npubuild.targets.backend.schedule import OpSchedule


class SplitMemo:
    """Splits by key (`key`), for the compiles of one target (the target's fields are not in it)."""

    def __init__(self) -> None:
        self.splits: dict[tuple, tuple[int, int]] = {}  # key -> (split, fresh bytes its trials took)
        self._alive: dict[int, object] = {}  # what the keys name by id()

    def get(self, key: tuple, lowering: Lowering) -> int | None:
        """The split stored for the key, if the stream's fresh constant area (if any) has the
        room its trials took."""
        found = self.splits.get(key)
        if found is None:
            return None
        split, fresh_bytes = found
        if lowering.fresh and 2 * lowering.sram.const_slot - align(lowering.fresh_end) < fresh_bytes:
            return None
        return split

    def put(self, key: tuple, split: int, fresh_bytes: int) -> None:
        self.splits[key] = (split, fresh_bytes)

    def key(
        self,
        ctx: OpContext,
        op: Op,
        fused: tuple[Op | None, ...],
        schedules: dict[int, OpSchedule | None],
        lowering: Lowering,
    ) -> tuple:
        objects = tuple(self._id(thing) for thing in (op, *fused, ctx.tensors, ctx.arrays))
        fit = tuple(
            ctx.sram.fits(part.fixed, part.per_tile, part.scratch)
            for sched in schedules.values()
            if sched is not None
            for part in (sched, *sched.parts)
        )
        tiling = (tuple(schedules.items()), fit, ctx.sram.const_slot > 0, ctx.mac_cols)
        trial = (lowering.sram.const_slot > 0, lowering.fresh, tuple(sorted(lowering.pinned)))
        pinned = tuple(sorted(ctx.pinned.items()))
        return (*objects, tiling, _tensors(ctx, op, fused), pinned, trial)

    def _id(self, thing: object) -> int | None:
        if thing is None:
            return None
        self._alive[id(thing)] = thing
        return id(thing)


def _tensors(ctx: OpContext, op: Op, fused: tuple[Op | None, ...]) -> tuple:
    """What the key holds of each tensor the op (and the ops fused into it) reads or writes, and
    of the inputs of upsamples it reads through."""
    names = sorted({n for o in (op, *fused) if o is not None for n in (*o.inputs, *o.outputs) if n})
    names += sorted({ctx.upsampled[n][0] for n in names if n in ctx.upsampled} - set(names))
    places = [space(ctx.addr[n]) if n in ctx.addr else None for n in names]
    lowest: dict[int, int] = {}  # memory space -> the lowest of the op's addresses in it
    for place in places:
        if place is not None:
            lowest[place[0]] = min(lowest.get(place[0], place[1]), place[1])
    return tuple(
        (
            n,
            None if place is None else (place[0], place[1] - lowest[place[0]]),
            tuple(ctx.shapes.get(n, ())),
            tuple(ctx.windows.get(n) or ()),
            ctx.shuffled.get(n),
            ctx.upsampled.get(n),
        )
        for n, place in zip(names, places)
    )
