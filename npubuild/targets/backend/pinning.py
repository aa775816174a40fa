"""Pinned tables: a lookup table that several ops of a subgraph read loads into SRAM once.

A striped chain (stripes.py) runs each of its ops once per stripe, and an op's constants go into
a constant slot that the next ops' constants overwrite, so each stripe loads its tables again.
That is cheap for an 8-bit table (256 entries) and not for a 16-bit one: PP-OCRv4 det's stem, its
HardSwish on 16-bit results (a mixed-precision table), loaded two 128 KiB tables in each of 8
stripes, 2 MB of DRAM reads where 256 KiB would do. A pinned table lives in SRAM set aside for it
just below the resident tensors, for the whole program: its first reader loads it there (a
constant group of its own, hoisted as any), the others read it where it is (`Lowering` drops
their loads), and every op's constants and tiles lie below it. The grouping search compiles this
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


def shared_tables(ctx: OpContext, ops: list[Op], indices: list[int], fusion: Fusion) -> dict[str, int]:
    """The tables (`OpContext.table_key` -> bytes) that two or more of the lookup-table ops among
    `indices` read, counting only the ops that run as their own instructions (a table a
    convolution applies in its output path goes with its weights)."""
    readers: dict[str, int] = {}
    sizes: dict[str, int] = {}
    for i in indices:
        op = ops[i]
        if op.kind != "lut" or i in fusion.absorbed:
            continue
        key = ctx.table_key(op)
        readers[key] = readers.get(key, 0) + 1
        sizes[key] = ctx.table_bytes(op)
    return {key: sizes[key] for key in sorted(sizes) if readers[key] > 1}


def pin(tables: dict[str, int], top: int) -> dict[str, int]:
    """SRAM addresses for `tables`, packed down from `top` (the lowest is the top of the SRAM left
    for the ops' constants and tiles)."""
    at, pinned = top, {}
    for key, size in tables.items():
        at -= align(size)
        pinned[key] = at
    return pinned
