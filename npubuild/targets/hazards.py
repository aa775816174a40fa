"""A checker of the cycle model's schedule: no instruction starts before an earlier one in the
stream that touches the same SRAM or DRAM bytes has finished, when either of them writes them.

The simulator executes a stream in order, so a missing wait never changes its results; it only
lets the timeline (`cycles.Timeline`, codegen's estimate) overlap two instructions that the
hardware could not, and report a latency it could not reach. This checks the waits against what
each instruction reads and writes: the data operands of every compute (source and destination
boxes, a global pool's accumulators), the constants it reads (weights, requantization
parameters, tables, index lists: as many bytes as the simulator reads there) and both sides of
every on-chip transfer; a strided box counts as the bytes from its first to its last element.
DRAM the same way (`dram_footprint`): a load from DRAM reads its source span, a store to DRAM
writes its destination span, so a load of a tensor that a store has not finished writing, or a
store over bytes a load is still reading (DRAM reused by a later tensor), is found as well.
"""

from __future__ import annotations

import math

import numpy as np

from npubuild.targets.cycles import Timeline
from npubuild.targets.isa import (
    Instruction,
    conv_weight_shape,
    entry_bits,
    far_span,
    input_box,
    table_entries,
)


def _bytes(bits: int) -> int:
    return 1 if bits == 8 else 2


def footprint(i: Instruction) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """(SRAM ranges read, SRAM ranges written) by one instruction, as [start, end) byte pairs."""
    a, op = i.args, i.op
    if op in ("load", "store"):
        tile = (a["sram"], a["sram"] + a["d0"] * a["d1"] * a["d2"] * a["d3"] * a["esize"])
        far = [far_span(a, "dram")] if a["space"] == 1 else []
        return ([], [tile]) if op == "load" and not far else (far, [tile]) if op == "load" else ([tile], far)

    def span(at: str, count: int, bits: int) -> tuple[int, int]:
        return (a[at], a[at] + count * _bytes(bits))

    def table(at: str, in_bits: int, shift: int, entry_bits: int) -> tuple[int, int]:
        return span(at, table_entries(in_bits, shift), entry_bits)

    def bordered() -> int:  # the elements of a conv's or pool's input box without its borders
        return math.prod(input_box(op, a))

    if op == "conv":  # a table or a residual Add in the output path writes its own width
        written_bits = a["sum_bits"] if a["res"] >= 0 else a["lut_bits"] if a["lut"] >= 0 else a["out_bits"]
        outputs = a["out_c"] * a["out_h"] * a["out_w"]
        residual = [span("res", outputs, a["res_bits"])] if a["res"] >= 0 else []
        shifts = a.get("lut_shifts", -1) if a["lut"] >= 0 else -1  # one per output channel
        constants = [
            span("weights", math.prod(conv_weight_shape(a)), 8),
            span("params", a["out_c"] * 3, 64),
            *(
                [table("lut", a["out_bits"], a["lut_shift"], entry_bits(a["lut_bits"], shifts))]
                if a["lut"] >= 0
                else []
            ),
            *([span("lut_shifts", a["out_c"], 8)] if shifts >= 0 else []),
        ]
        return (
            [span("src", bordered(), a["in_bits"]), *residual, *constants],
            [span("dst", outputs, written_bits)],
        )
    if op == "matmul":
        constants = [span("weights", a["k"] * a["n"], 8), span("params", a["n"] * 3, 64)]
        return [span("src", a["m"] * a["k"], a["in_bits"]), *constants], [
            span("dst", a["m"] * a["n"], a["out_bits"])
        ]
    if op in ("add", "mul"):
        reads = [span(x, a[f"{x}0"] * a[f"{x}1"] * a[f"{x}2"] * a[f"{x}3"], a[f"{x}_bits"]) for x in "ab"]
        written_bits = a["sum_bits"] if a.get("then_add") else a["out_bits"]
        return reads, [span("dst", a["o0"] * a["o1"] * a["o2"] * a["o3"], written_bits)]
    if op == "lut":
        shifts = a.get("shifts", -1)  # one per run of `per` elements (a channel of the tile)
        reads = [
            span("src", a["n"], a["in_bits"]),
            table("table", a["in_bits"], a["shift"], entry_bits(a["out_bits"], shifts)),
            *([span("shifts", a["n"] // max(a["per"], 1), 8)] if shifts >= 0 else []),
        ]
        return reads, [span("dst", a["n"], a["out_bits"])]
    if op == "requant":
        return [span("src", a["n"], a["in_bits"])], [span("dst", a["n"], a["out_bits"])]
    if op == "clamp":
        return [span("src", a["n"], a["bits"])], [span("dst", a["n"], a["bits"])]
    if op == "gap":
        accumulators = (a["acc"], a["acc"] + a["c"] * 8)
        return (
            [span("src", a["c"] * a["hw"], a["in_bits"]), accumulators],
            [accumulators, *([span("dst", a["c"], a["out_bits"])] if a["last"] else [])],
        )
    if op == "pool":
        outputs = a["c"] * a["out_h"] * a["out_w"]
        # an average pool's divisors: a multiplier and a shift (int64) per output position
        divisors = [span("params", a["out_h"] * a["out_w"] * 2, 64)] if a["mode"] else []
        return [span("src", bordered(), a["in_bits"]), *divisors], [span("dst", outputs, a["out_bits"])]
    if op == "resize":
        return (
            [
                span("src", a["c"] * a["in_h"] * a["in_w"], a["bits"]),
                span("index", a["out_h"] + a["out_w"], 32),
            ],
            [span("dst", a["c"] * a["out_h"] * a["out_w"], a["bits"])],
        )
    if op in ("softmax", "layernorm"):
        constants = span("table", a["table_len"], 32) if op == "softmax" else span("params", a["n"] * 3, 64)
        return [span("src", a["rows"] * a["n"], a["in_bits"]), constants], [
            span("dst", a["rows"] * a["n"], a["out_bits"])
        ]
    if op == "bmm":
        return (
            [span("a", a["m"] * a["k"], a["a_bits"]), span("b", a["k"] * a["n"], a["b_bits"])],
            [span("dst", a["m"] * a["n"], a["out_bits"])],
        )
    return [], []


def dram_footprint(i: Instruction) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """(DRAM ranges read, DRAM ranges written) by one instruction: a load's source or a store's
    destination where its far side is DRAM (`space` 0)."""
    if i.op not in ("load", "store") or i.args["space"] != 0:
        return [], []
    far = [far_span(i.args, "dram")]
    return (far, []) if i.op == "load" else ([], far)


class _Uses:
    """When the last writer and the last reader of each byte of one memory finish. SRAM is
    indexed by byte; DRAM (tens of megabytes of weights) by the segments between the span ends
    the program names (`bounds`), each of which every span covers whole or not at all."""

    def __init__(self, memory: str, size: int, bounds: np.ndarray | None = None):
        self.memory, self.bounds = memory, bounds
        cells = size + 1 if bounds is None else max(len(bounds) - 1, 1)
        self.written = np.zeros(cells, np.int64)
        self.read = np.zeros(cells, np.int64)

    def _cells(self, lo: int, hi: int) -> slice:
        if self.bounds is None:
            return slice(lo, hi)
        return slice(int(np.searchsorted(self.bounds, lo)), int(np.searchsorted(self.bounds, hi)))

    def check(self, k: int, i: Instruction, start: int, done: int, reads, writes) -> list[str]:
        found = []
        reads = [(lo, hi, self._cells(lo, hi)) for lo, hi in reads if hi > lo]
        writes = [(lo, hi, self._cells(lo, hi)) for lo, hi in writes if hi > lo]
        where = "" if self.memory == "SRAM" else f"{self.memory} "
        for lo, hi, cells in reads:
            if (late := int(self.written[cells].max())) > start:
                found.append(f"#{k} {i.op} reads {where}[{lo}, {hi}) at {start}, written until {late}")
        for lo, hi, cells in writes:
            if (late := int(max(self.written[cells].max(), self.read[cells].max()))) > start:
                found.append(f"#{k} {i.op} writes {where}[{lo}, {hi}) at {start}, in use until {late}")
        for _, _, cells in reads:
            self.read[cells] = np.maximum(self.read[cells], done)
        for _, _, cells in writes:
            self.written[cells] = np.maximum(self.written[cells], done)
        return found


def hazards(program: list[Instruction], target: dict, sram_bytes: int, most: int = 10) -> list[str]:
    """Up to `most` instructions that the timeline starts before an earlier instruction touching
    the same SRAM or DRAM bytes (a write on either side) has finished; empty when there is none."""
    timeline = Timeline(target)
    far = [dram_footprint(i) for i in program]
    ends = [end for sides in far for side in sides for span in side for end in span]
    sram, dram = _Uses("SRAM", sram_bytes), _Uses("DRAM", 0, np.unique(np.array(ends or [0], np.int64)))
    found: list[str] = []
    for k, i in enumerate(program):
        start, done = timeline.add(i)
        found += sram.check(k, i, start, done, *footprint(i))
        found += dram.check(k, i, start, done, *far[k])
        if len(found) >= most:
            break
    return found[:most]


def binary_hazards(data: bytes, most: int = 10) -> list[str]:
    """`hazards` over every NPU subgraph of a `.npub`, each entry naming its subgraph."""
    from npubuild.targets import npub
    from npubuild.targets.isa import subgraph_program

    binary = npub.read(data)
    target = binary.meta["target"]
    found = []
    for k, sg in enumerate(binary.meta["subgraphs"]):
        if sg["device"] == "npu":
            code = subgraph_program(binary, sg, k)
            found += [f"subgraph {k}: {h}" for h in hazards(code, target, target["sram_kib"] * 1024, most)]
    return found[:most]
