"""Constant groups as the DMA sees them: each group's arrays as one record.

A DMA pays `dram_latency_cycles` per load whatever it moves, and the MobileNet-style layers of a
small network (PP-OCR cls's squeeze-excite convolutions: 1-14 cycles of MACs on 1-5 KiB of
weights) spent far longer waiting for their constants than computing, two or three loads of them
per op. So an op's table, weight chunk and parameters go into SRAM by one load of a record that
holds them as they lie in the constant area (`pack_constants`).
"""

from __future__ import annotations

import hashlib

import numpy as np

from npubuild.targets.backend.commands import Command, ConstLoads, Step, box_bytes, const_load
from npubuild.targets.backend.context import ConstantPool


def pack_constants(pool: ConstantPool, commands: list[Command]) -> list[Command]:
    """Each constant group of several loads as one load of a record: the bytes the group puts into
    the constant area (a table, a weight chunk, its parameters, the gaps between them as zeros)
    stored together in the pool, so the DMA pays its latency once per group, not once per array.
    Records are deduplicated by content; `ConstantPool.compact` later drops the arrays that only
    records read."""
    for command in commands:
        if not isinstance(command, ConstLoads) or len(command.loads) < 2:
            continue
        spans = sorted(((load.args["sram"].offset, load) for load in command.loads), key=lambda s: s[0])
        hi = spans[0][0]
        for offset, load in spans:
            if offset < hi:
                break  # overlapping loads: the order they land in would matter
            hi = offset + box_bytes(load)
        else:
            command.loads = [_record(pool, spans)]
    return commands


def _record(pool: ConstantPool, spans: list[tuple[int, Step]]) -> Step:
    """One load of the bytes the loads `spans` put at their constant-area offsets (gaps zero),
    made once per compile for each set of sources (`ConstantPool.records`)."""
    lo = spans[0][0]
    source = tuple((offset, pool.source(load)) for offset, load in spans)
    if source not in pool.records:
        parts = [(offset, pool.image(load)) for offset, load in spans]
        record = np.zeros(max(offset + len(b) for offset, b in parts) - lo, np.uint8)
        for offset, data in parts:
            record[offset - lo : offset - lo + len(data)] = data
        pool.records[source] = (f"record#{hashlib.sha256(record.tobytes()).hexdigest()}", record)
    key, data = pool.records[source]
    return const_load(lo, pool.add(key, data), len(data))
