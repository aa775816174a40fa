"""The cycle model (docs/npu.md): what each instruction costs on its engine, and the timeline of
four in-order engine queues synchronised by tokens.

An instruction starts when its engine is free and every token it waits for has been signalled by
the most recent instruction before it that signals that token; it then occupies its engine for its
cost. DMA: latency + bytes / bandwidth. MAC array (R rows x C columns): by the instruction's
mapping (`conv_cycles`); int16 inputs run at `int16_rate`. Vector unit: elements / lanes (x2 for
16-bit data). On a target with `channelwise_on_array`, pooling and multiplies by a per-channel
vector go to the MAC array's depthwise path instead (`engine`, `channelwise_cycles`).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from functools import lru_cache

from npubuild.targets.isa import ENGINES, MAPPINGS, NO_SIGNAL, TOKENS, Instruction, far_box

SRAM_COPY_LATENCY = 4
MAPPING_NAMES = {code: name for name, code in MAPPINGS.items()}
# What the array's depthwise path can take: each column holds one channel's weight (a gate value,
# or ones for a pool's sum; a max pool runs its adder chain in its max mode) and sums that
# channel's inputs; a mul only where one operand is one value per channel (`_by_channel_values`)
CHANNELWISE_OPS = frozenset({"gap", "pool", "mul"})


def engine(i: Instruction, target: dict | None) -> str:
    """The engine queue an instruction runs on: its opcode's (isa.ENGINES), except that on a
    target with `channelwise_on_array` and the depthwise mapping a global or window pool and a
    multiply of a map by one value per channel (a squeeze-excite gate, an unfolded batch norm's
    scale) run on the MAC array's depthwise path (docs/npu.md, "Channel-wise ops on the array")."""
    if (  # the opcode first: every instruction of every timeline comes through here
        i.op in CHANNELWISE_OPS
        and target is not None
        and target.get("channelwise_on_array")
        and "depthwise" in target.get("conv_mappings", ())
        and (i.op != "mul" or _by_channel_values(i.args))
    ):
        return "mac"
    return ENGINES[i.op]


def _by_channel_values(a: dict) -> bool:
    """Whether a mul multiplies a map (one operand covers the whole output box) by one value per
    channel, or one value (the other operand is a box of 1 x 1 positions)."""
    out = [a["o0"], a["o1"], a["o2"], a["o3"]]
    if out[2] * out[3] <= 1:
        return False
    for vector, full in (("b", "a"), ("a", "b")):
        v = [a[f"{vector}{k}"] for k in range(4)]
        if [a[f"{full}{k}"] for k in range(4)] == out and v[2] == v[3] == 1 and v[1] in (1, out[1]):
            return True
    return False


def channelwise_cycles(i: Instruction, rows: int, cols: int, row_bands: bool) -> int:
    """Cycles of a pool or a per-channel multiply on the depthwise path at int8: a depthwise
    convolution of `taps` taps (a global pool: the whole map, one position; a window pool: its
    window; a multiply: one tap, the gate as its weight) over the channels (conv_cycles)."""
    a = i.args
    if i.op == "gap":
        return depthwise_cycles(a["hw"], a["c"], 1, rows, cols, row_bands)
    if i.op == "pool":
        return depthwise_cycles(a["kh"] * a["kw"], a["c"], a["out_h"] * a["out_w"], rows, cols, row_bands)
    return a["o0"] * depthwise_cycles(1, a["o1"], a["o2"] * a["o3"], rows, cols, row_bands)


def depthwise_cycles(taps: int, channels: int, positions: int, rows: int, cols: int, row_bands: bool) -> int:
    """The depthwise mapping: each column one channel's taps in row folds (`row_folds`), channels
    and spare columns packed (`packed`)."""
    return sum(
        folds * packed(channels, steps, cols) for folds, steps in row_folds(taps, positions, rows, row_bands)
    )


def array_rate(i: Instruction, target: dict) -> float:
    """The MAC array's throughput for an instruction relative to int8: `int16_rate` where an
    operand it multiplies is 16-bit (a convolution's or fully-connected layer's input, either
    side of a product of two activations), 1 otherwise."""
    a = i.args
    wide = 16 in (a.get("in_bits", 8), a.get("a_bits", 8), a.get("b_bits", 8))
    return target["int16_rate"] if wide else 1.0


def cost(i: Instruction, target: dict) -> int:
    # (a fold count times 1 / rate on the array's MAC paths, divided by the rate on the
    # channel-wise one: as each was first written, so that a target's int16_rate that is not a
    # power of two rounds as before)
    a = i.args
    rows, cols, lanes = target["mac_rows"], target["mac_cols"], target["vector_lanes"]
    if i.op in ("load", "store"):
        moved = moved_bytes(i)
        if a["space"] == 1:  # on-chip copy of a resident tensor: no DRAM latency, SRAM bandwidth
            return SRAM_COPY_LATENCY + math.ceil(max(moved, 0) / target["sram_bytes_per_cycle"])
        return target["dram_latency_cycles"] + math.ceil(max(moved, 0) / target["dram_bytes_per_cycle"])
    if i.op == "conv":
        folds = conv_cycles(a, a["mapping"], rows, cols, target.get("row_bands", False))
        return math.ceil(folds * (1.0 / array_rate(i, target)))
    if i.op in ("matmul", "bmm"):
        folds = math.ceil(a["n"] / cols) * math.ceil(a["k"] / rows) * a["m"]
        return math.ceil(folds * (1.0 / array_rate(i, target)))
    if i.op == "end":
        return 0
    if engine(i, target) == "mac":  # a pool or a per-channel multiply on the depthwise path
        shape = (rows, cols, target.get("row_bands", False))
        return math.ceil(channelwise_cycles(i, *shape) / array_rate(i, target))
    width = 2 if max(a.get("out_bits", 8), a.get("bits", 8), a.get("in_bits", 8)) == 16 else 1
    if i.op in ("add", "mul"):
        elements = a["o0"] * a["o1"] * a["o2"] * a["o3"]
        if a.get("then_add"):  # a chained residual Add: a second pass over the elements
            width = max(width, 2 if a["sum_bits"] == 16 else 1)
            elements *= 2
    elif i.op == "pool":
        elements = a["c"] * a["out_h"] * a["out_w"] * a["kh"] * a["kw"]
    elif i.op == "gap":
        elements = a["c"] * a["hw"]
    elif i.op == "resize":
        elements = a["c"] * a["out_h"] * a["out_w"]
    elif i.op in ("softmax", "layernorm"):  # two passes over each row: its sums, then its outputs
        elements = 2 * a["rows"] * a["n"]
    else:  # requant, lut, clamp
        elements = a["n"]
    return math.ceil(elements * width / lanes)


def conv_cycles(a: dict, mapping: int, rows: int, cols: int, row_bands: bool) -> int:
    """Cycles of one conv instruction at int8 under a mapping (docs/npu.md, "Mappings").

    Every mapping puts a sum of `reduction` products down a column's R rows (input channels per
    group x kh x kw; depthwise: the taps), over ceil(reduction / R) row folds; on an array with
    `row_bands`, the fold holding the remainder of the sum (all of it, where it is under R), where
    it fits twice or more, holds b = floor(R / remainder) bands of rows, each another output
    position's sum into its own accumulator (the column's adder chain cut at the bands' edges),
    so that fold takes ceil(positions / b) steps (`row_folds`).
    channels: group x ceil(out_c per group / C) column folds, one step per position (transposed:
    one input position per tap).
    spatial: u positions side by side, each with its own copy of the filters, u x out_c columns
    over ceil(u x out_c / C) column folds, at the cheapest u (`packed`: 24 channels on 32 columns,
    4 positions in 3 folds, where one position takes one fold). Transposed: an input position's
    out_c x taps filters take the columns (every tap at once) (format 3.1).
    depthwise: the channels across the columns, each column holding its channel's taps and fed
    its own channel's input, packed as spatial packs filters (fewer or more channels than
    columns: other positions in the spare columns)."""
    group = a["group"]
    taps = a["kh"] * a["kw"]
    if a["transpose"]:
        per_group_out, reduction = a["out_c"] // group, a["in_c"] // group
        positions = a["in_h"] * a["in_w"]
    else:
        per_group_out, reduction = a["out_c"] // group, (a["in_c"] // group) * taps
        positions = a["out_h"] * a["out_w"]
    if mapping == MAPPINGS["depthwise"]:
        return depthwise_cycles(taps, a["out_c"], positions, rows, cols, row_bands)
    passes = row_folds(reduction, positions, rows, row_bands)
    if mapping == MAPPINGS["spatial"]:
        columns = per_group_out * (taps if a["transpose"] else 1)
        return group * sum(folds * packed(columns, steps, cols) for folds, steps in passes)
    column_folds = group * math.ceil(per_group_out / cols) * (taps if a["transpose"] else 1)
    return column_folds * sum(folds * steps for folds, steps in passes)


def row_folds(reduction: int, positions: int, rows: int, row_bands: bool) -> list[tuple[int, int]]:
    """(row folds, steps of each) of a sum of `reduction` products at each of `positions` output
    positions on R rows: the whole folds, one position per step, then the fold that holds the
    remainder; with `row_bands` it takes floor(R / remainder) positions per step, each band of
    remainder rows summing another position into its own accumulator (a sum smaller than R is
    all remainder: 3 bands for 9 taps). A 1 x 1 layer of 34 input channels per group: a whole
    fold, then 2 rows in 16 bands."""
    whole, remainder = divmod(reduction, rows)
    passes = [(whole, positions)] if whole else []
    if remainder:
        bands = max(rows // remainder, 1) if row_bands else 1
        passes.append((1, math.ceil(positions / bands)))
    return passes


@lru_cache(maxsize=4096)
def packed(columns: int, positions: int, cols: int) -> int:
    """Column folds x steps of `positions` that each take `columns` of the array's `cols`
    columns, u positions side by side over ceil(u x columns / cols) folds, at the cheapest u."""
    if columns <= 0 or positions <= 0:
        return 0
    return min(
        math.ceil(u * columns / cols) * math.ceil(positions / u) for u in range(1, min(cols, positions) + 1)
    )


def conv_mapping(a: dict, target: dict) -> int:
    """The mapping the code generator gives a conv instruction, among the target's
    `conv_mappings`: depthwise for a depthwise convolution (one input channel per group);
    spatial for any other where that is cheaper than channels (fewer output channels per group
    than the array has columns, or a count that leaves a fold part empty: 24 or 48 of 32,
    ShuffleNet's 34 per group; PP-OCRv4 det's last ConvTranspose, 1 output channel of 2 x 2
    taps, is 32x faster so); channels otherwise."""
    offered = target["conv_mappings"]
    if a["group"] > 1 and a["in_c"] == a["group"] and not a["transpose"] and "depthwise" in offered:
        return MAPPINGS["depthwise"]
    if "spatial" in offered:
        shape = (target["mac_rows"], target["mac_cols"], target.get("row_bands", False))
        spatial, channels = MAPPINGS["spatial"], MAPPINGS["channels"]
        cheaper = conv_cycles(a, spatial, *shape) < conv_cycles(a, channels, *shape)
        return spatial if cheaper else channels
    return MAPPINGS["channels"]


def timing_key(target: dict | None) -> str:
    """A target as the key of an instruction's `timing` memo: every field, since `engine` and
    `cost` read several and a target dict may be changed in place between timelines. The last
    target's key is kept with a copy of it: a compile builds tens of thousands of timelines for
    one target, and comparing two dicts is cheaper than writing one out."""
    if not target:
        return ""
    seen, key = _LAST_TIMING_KEY
    if seen != target:
        key = repr(sorted(target.items()))
        _LAST_TIMING_KEY[:] = [copy.deepcopy(target), key]
    return key


_LAST_TIMING_KEY: list = [None, ""]


@dataclass
class Timeline:
    target: dict
    engine_free: dict[str, int] = field(default_factory=dict)
    signalled: list[int] = field(default_factory=lambda: [0] * TOKENS)
    busy: dict[str, int] = field(default_factory=dict)
    end: int = 0

    def __post_init__(self) -> None:
        self.key = timing_key(self.target)

    def add(self, i: Instruction) -> tuple[int, int]:
        """Runs one instruction; when it started and when it finished."""
        return self.run((i,))

    def run(self, program) -> tuple[int, int]:
        """Runs the instructions in order (the searches' inner loop: a stream of thousands, costed
        for every alternative); when the last started and when it finished."""
        key, target, signalled, busy = self.key, self.target, self.signalled, self.busy
        free, end, ready, done = self.engine_free, self.end, 0, 0
        for i in program:
            timing = i.timing.get(key)
            if timing is None:
                waits = tuple(t for t in range(TOKENS) if i.wait >> t & 1)
                timing = i.timing[key] = (engine(i, target), cost(i, target), waits)
            queue, spent, waits = timing
            ready = free.get(queue, 0)
            for t in waits:
                if signalled[t] > ready:
                    ready = signalled[t]
            if i.op == "end" and end > ready:
                ready = end
            done = ready + spent
            free[queue] = done
            busy[queue] = busy.get(queue, 0) + spent
            if i.signal != NO_SIGNAL:
                signalled[i.signal] = done
            if done > end:
                end = done
        self.end = end
        return ready, done


def estimate(program: list[Instruction], target: dict) -> dict:
    timeline = Timeline(target)
    timeline.run(program)
    return {
        "cycles": timeline.end,
        "busy": dict(sorted(timeline.busy.items())),
        "macs": sum(macs(i) for i in program),
    }


def end_cycle(program: list[Instruction], target: dict) -> int:
    """estimate's cycles alone: what the code generator's searches compare, many times over."""
    timeline = Timeline(target)
    timeline.run(program)
    return timeline.end


def macs(i: Instruction) -> int:
    """Multiply-accumulates an instruction performs (MAC-array instructions only)."""
    a = i.args
    if i.op == "conv":
        per_output = (a["in_c"] // a["group"]) * a["kh"] * a["kw"]
        if a["transpose"]:  # every input position scatters into every tap and output channel
            return a["in_h"] * a["in_w"] * a["kh"] * a["kw"] * a["in_c"] * (a["out_c"] // a["group"])
        return a["out_c"] * a["out_h"] * a["out_w"] * per_output
    if i.op in ("matmul", "bmm"):  # a batched product's instruction is one matrix of its batch
        return a["m"] * a["k"] * a["n"]
    return 0


def moved_bytes(i: Instruction) -> int:
    """Bytes a DMA instruction copies (padding excluded), whichever memory is on the far side."""
    a = i.args
    if i.op == "store":
        return a["d0"] * a["d1"] * a["d2"] * a["d3"] * a["esize"]
    if i.op == "load":
        _, _, rows, columns = far_box(a)
        return a["d0"] * a["d1"] * max(rows * columns, 0) * a["esize"]
    return 0


def dram_bytes(i: Instruction) -> int:
    """Bytes a DMA instruction moves across the DRAM interface."""
    return moved_bytes(i) if i.op in ("load", "store") and i.args["space"] == 0 else 0


def per_op(program: list[Instruction], marks: list, target: dict) -> list[dict]:
    """Each op's share of the timeline: its span, compute and DMA busy cycles, MACs, DRAM bytes."""
    timeline = Timeline(target)
    bounds = sorted({at for at, _, _ in marks} | {len(program)})
    names = {}
    for at, node, kind in marks:
        names[at] = (node, kind)  # an op with no instructions shares the next op's index: last wins
    rows = []
    for start, end in zip(bounds, bounds[1:]):
        if start not in names or all(i.op == "end" for i in program[start:end]):
            continue  # no op here, or one that emits nothing at the stream's end (a fused Add)
        first = last = None
        compute = dma = moved = work = wide_work = 0
        mappings = set()
        for i in program[start:end]:
            if i.op == "conv":
                mappings.add(MAPPING_NAMES.get(i.args["mapping"], "?"))
            elif ENGINES[i.op] == "vector" and engine(i, target) == "mac":  # a pool or gate on the array
                mappings.add("depthwise")
            ready, done = timeline.add(i)
            first = ready if first is None else min(first, ready)
            last = done if last is None else max(last, done)
            spent = done - ready
            if ENGINES[i.op] in ("dma_in", "dma_out"):
                dma += spent
                moved += dram_bytes(i)
            elif ENGINES[i.op] in ("mac", "vector"):  # engine() only moves vector ops to the array
                compute += spent
            work += macs(i)
            if array_rate(i, target) < 1.0:
                wide_work += macs(i)
        node, kind = names[start]
        rows.append(
            {
                "node": node,
                "kind": kind,
                "start": first or 0,
                "end": last or 0,
                "compute_cycles": compute,
                "dma_cycles": dma,
                "dram_bytes": moved,
                "macs": work,
                **({"int16_macs": wide_work} if wide_work else {}),
                **({"mapping": "+".join(sorted(mappings))} if mappings else {}),
            }
        )
    return rows


def roofline(macs_count: int, compulsory_bytes: int, target: dict, int16_macs: int = 0) -> int:
    """max(MACs / peak MACs per cycle, compulsory DRAM bytes / bandwidth), in cycles; the
    `int16_macs` among the MACs at the array's 16-bit peak (peak x `int16_rate`)."""
    peak = target["mac_rows"] * target["mac_cols"]
    mac_cycles = (macs_count - int16_macs) / peak + int16_macs / (peak * target["int16_rate"])
    return math.ceil(max(mac_cycles, compulsory_bytes / target["dram_bytes_per_cycle"]))
