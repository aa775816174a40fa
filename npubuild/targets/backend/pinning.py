"""Pinned tables: a lookup table that several ops of a subgraph read loads into SRAM once.

A striped chain (stripes.py) runs each of its ops once per stripe, and an op's constants go into
a constant slot that the next ops' constants overwrite, so each stripe loads its tables again.
That is cheap for an 8-bit table (256 entries) and not for a 16-bit one: PP-OCRv4 det's stem, its
HardSwish on 16-bit results (a mixed-precision table), loaded two 128 KiB tables in each of 8
stripes, 2 MB of DRAM reads where 256 KiB would do. A pinned table lives in SRAM set aside for it
just below the resident tensors, for the whole program: its first reader loads it there (a
constant group of its own that takes no turn of the constant slots and may load several ops
early: lowering.py), the others read it where it is (`Lowering` drops their loads), and every
op's constants and tiles lie below it. The grouping search compiles this
as one more choice (compile.py) and keeps it where it wins: the SRAM it takes is lost to every
op's tiles. (Setting it aside only from the first reader to the last measured slower on the
example's det: the first load could then not be hoisted into the op before, whose tiles may lie
there.)
"""

from __future__ import annotations

from npubuild.intmodel.program import Op
from npubuild.targets.backend.context import OpContext
from npubuild.targets.backend.fusion import Fusion
from npubuild.targets.backend.memory import align

# `every` pins the tables one op reads only where the tables add up to this many bytes: a 16-bit
# table (32,768 or 65,536 entries), whose load the op before cannot hide, or eight 8-bit ones
# (256 bytes each), each of which would take a turn of the constant slots (ViT-S: twelve). Below
# it (YOLOv8n: one 512-byte table) the choice gained 4 cycles of 1,031,259 for 12 more compiles.
EVERY_TABLE_BYTES = 2048


def pinned_tables(
    ctx: OpContext, ops: list[Op], indices: list[int], fusion: Fusion, every: bool = False
) -> dict[str, int]:
    """The tables (`OpContext.table_key` -> bytes) to pin: those two or more of the lookup-table
    ops among `indices` read, counting only the ops that run as their own instructions (a table a
    convolution applies in its output path goes with its weights); with `every`, those one op
    reads as well, so that they may load early and take no turn of the constant slots
    (lowering.py), where the tables add up to `EVERY_TABLE_BYTES` or more."""
    readers: dict[str, int] = {}
    sizes: dict[str, int] = {}
    for i in indices:
        op = ops[i]
        if op.kind != "lut" or i in fusion.absorbed:
            continue
        key = ctx.table_key(op)
        readers[key] = readers.get(key, 0) + 1
        sizes[key] = ctx.table_bytes(op)
    if every and sum(sizes.values()) < EVERY_TABLE_BYTES:
        every = False
    return {key: sizes[key] for key in sorted(sizes) if every or readers[key] > 1}


def pin(tables: dict[str, int], top: int) -> dict[str, int]:
    """SRAM addresses for `tables`, packed down from `top` (the lowest is the top of the SRAM left
    for the ops' constants and tiles)."""
    at, pinned = top, {}
    for key, size in tables.items():
        at -= align(size)
        pinned[key] = at
    return pinned
