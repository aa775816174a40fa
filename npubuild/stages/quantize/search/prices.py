"""The precision search's price list: what the code generator's own timeline says each op costs on
the target at int8 and at int16.

Two tables are compiled exactly as the build compiles one (quantize, partition, codegen): every
layer int8 and every layer int16. An op's span on the code generator's timeline (its first
instruction's start to its last one's end; consecutive spans add up to the estimate) is its price
at that width. A table's cost is the sum of its ops' prices at the widths the table gives them: a
MAC op pays for its span's growth from int8 to int16 split as its compute and its DMA grew, the
compute part by its input's width (the array runs 16-bit inputs at `int16_rate`), the DMA part by
the widths of the elements it moves in and out (since the depthwise and spatial mappings many
convolutions are bound by their DMA, whose bytes follow both widths); a lookup
table for its size, entries by the input's width (65,536 for 16 bits) times the output's bytes
(a 16-bit input and an 8-bit output: half the int16 price); any other op pays halfway between its
input's and its output's width (it streams both); no op is cheaper than at int8. A layer the table
keeps float pays the CPU model's cost (targets/cpu_cost.py); the hand-overs are counted as the
partition orders the ops (targets/partition.py: adjacent float layers are one CPU part, one pair of
hand-overs), and each NPU part they add a start, measured once from a compile with one layer float;
what the all-int8 compile holds beyond its ops' prices (the input's quantize, unsupported ops on
the CPU) is a fixed cost, so that the all-int8 table's price is that compile's estimate. The
result is in NPU cycles of estimated latency, the figure codegen reports as
`estimated_latency_ms`; tests/test_search_prices.py compiles tables and compares.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace

import onnx

from npubuild.intmodel.ops import LUT_OPS, MAC_OPS, TABULATED_OPS
from npubuild.intmodel.program import parse
from npubuild.stages.onnx_utils import tensor_readers
from npubuild.stages.quantize.graphinfo import node_label
from npubuild.stages.quantize.integer_model import build_integer_model
from npubuild.stages.quantize.precision import Layers, precision_overrides
from npubuild.targets.compile import compile_npub, plan_partition
from npubuild.targets.partition import order
from npubuild.targets.spec import TargetSpec

WIDE_TABLE_BYTES = 65536 * 2  # an int16-to-int16 lookup table
TABLE_OPS = LUT_OPS | TABULATED_OPS


def latency_cycles(codegen_stats: dict, target: TargetSpec) -> float:
    """codegen's estimated latency (NPU, CPU and hand-overs) in NPU cycles."""
    return codegen_stats["estimated_latency_ms"] * target.clock_mhz * 1000.0


def table_settings(settings: dict, table: dict, layers: Layers) -> dict:
    """The quantize settings of a precision table: the user's overrides, then the table's."""
    return {
        **settings["quantize"],
        "overrides": list(settings["quantize"].get("overrides", []))
        + precision_overrides(layers.expand(table)),
    }


@dataclass(frozen=True)
class CompiledTable:
    """A precision table built as the build builds it: codegen's figures, and what its plan chose
    (the facts `Prices.table_cycles` prices a plan by)."""

    stats: dict  # codegen.json's figures
    tensor_bits: dict[str, int]
    integer_nodes: frozenset[str]
    fine: frozenset[str]  # its fine pre-activations
    cpu_nodes: frozenset[str]  # the nodes the partition runs on the CPU


def compile_table(
    model: onnx.ModelProto,
    stats_meta: dict,
    stats_arrays: dict,
    settings: dict,
    table: dict,
    layers: Layers,
    fresh: bool = True,
) -> CompiledTable:
    """A precision table on the target, built as the build builds it: integer model, partition,
    code generation (without fresh constants where `fresh` is False: `Prices.compiled`)."""
    target = TargetSpec.model_validate(settings["target"])
    quantize = table_settings(settings, table, layers)
    program, meta, arrays = build_integer_model(model, stats_meta, stats_arrays, quantize)
    parsed = parse(meta, "the integer model of a precision table")
    partition = plan_partition(parsed, arrays, model, target)
    _, _, stats = compile_npub(parsed, arrays, model, target, partition, fresh=fresh)
    return CompiledTable(
        stats,
        {name: t["bits"] for name, t in program.tensors.items()},
        frozenset(program.integer_nodes),
        frozenset(program.fine_preactivations),
        frozenset(f["node"] for f in partition["fallbacks"]),
    )


def device_parts(graph: onnx.GraphProto, on_npu: Callable[[str], bool]) -> tuple[int, int]:
    """(hand-overs, NPU parts) when the nodes `on_npu` accepts run on the NPU and the others on
    the CPU, in the order the partition runs them (a topological order that stays on one device
    while it can: targets/partition.py)."""
    ops = [SimpleNamespace(inputs=[i for i in n.input if i], outputs=list(n.output)) for n in graph.node]
    devices = ["npu" if on_npu(node_label(n)) else "cpu" for n in graph.node]
    parts = order(ops, devices)
    return max(len(parts) - 1, 0), sum(1 for p in parts if p["device"] == "npu")


def unstored_results(graph: onnx.GraphProto, fine: set[str]) -> list[str]:
    """The plan's fine pre-activations (`fine`: 16-bit MAC results that only an activation reads)
    that a convolution makes: the code generator runs their table in the convolution's output path
    (targets/backend/fusion.py), so they are never stored, and the op costs what it costs at int8
    (the all-int8 compile has them too). A MatMul's result is stored: priced at 16 bits."""
    return [n.output[0] for n in graph.node if n.op_type == "Conv" and n.output[0] in fine]


@dataclass(frozen=True)
class Busy:
    """An op's share of one compile's timeline: its span, and its compute and DMA busy cycles."""

    span: int = 0
    compute: int = 0
    dma: int = 0


@dataclass(frozen=True)
class Prices:
    int8: dict[str, Busy]  # node -> its share of the every-layer-int8 compile
    int16: dict[str, Busy]
    fixed: float  # what the int8 compile's estimate holds beyond its ops' prices (CPU, hand-overs)
    target: TargetSpec
    cpu_nodes: frozenset[str] = frozenset()  # what the int8 compile already runs on the CPU
    int8_integer: frozenset[str] = frozenset()  # the all-int8 plan's integer nodes
    int8_cuts: tuple[int, int] = (0, 1)  # its (hand-overs, NPU parts), as `device_parts` counts
    part_start: float = 0.0  # cycles an NPU part added by float layers costs (`_with_part_start`)

    @classmethod
    def compiled(
        cls,
        model: onnx.ModelProto,
        stats_meta: dict,
        stats_arrays: dict,
        settings: dict,
        layers: Layers,
        work: dict[str, dict],
        with_int16: bool = True,
    ) -> Prices:
        """Compile every layer at int8 and, when a table may hold int16 layers, every layer at
        int16 (`settings`: quantize, target; `work`: every node's, stages/quantize/cost.op_work);
        the all-int8 table is then priced at exactly the int8 compile's estimate (`fixed`), and an
        NPU part's start is measured."""
        target = TargetSpec.model_validate(settings["target"])
        compiled: dict[int, CompiledTable] = {}
        for width in (8, 16) if with_int16 else (8,):
            # without fresh constants: a fresh binary's constant loads run far ahead of their op,
            # so its per-op spans overlap and do not add up (docs/mixed-precision.md)
            every = {u: f"int{width}" for u in layers.units}
            compiled[width] = compile_table(
                model, stats_meta, stats_arrays, settings, every, layers, fresh=False
            )
        int8 = compiled[8]
        busy8 = _busy(int8.stats)
        busy16 = _busy(compiled[16].stats) if with_int16 else busy8
        prices = cls(busy8, busy16, 0.0, target, int8.cpu_nodes, int8.integer_nodes)
        prices = dataclasses.replace(
            prices, int8_cuts=device_parts(model.graph, prices.on_npu(int8.integer_nodes))
        )
        # the ops of the all-int8 plan priced as a table (a depthwise input the default widens
        # is read at int16 in both compiles, and its op's span already holds that), and the rest
        # of the int8 compile's estimate fixed: the price list's anchor
        ops = prices.table_cycles(model.graph, int8.tensor_bits, set(int8.integer_nodes), [], work, int8.fine)
        prices = dataclasses.replace(prices, fixed=latency_cycles(int8.stats, target) - ops)
        return prices._with_part_start(model, stats_meta, stats_arrays, settings, layers, int8.stats)

    def _with_part_start(
        self,
        model: onnx.ModelProto,
        stats_meta: dict,
        stats_arrays: dict,
        settings: dict,
        layers: Layers,
        int8_stats: dict,
    ) -> Prices:
        """These prices with `part_start` measured: the model's middle MAC layer kept float cuts
        the NPU program, and the NPU's own time grows (beyond the spans the layer leaves) by a
        part's start per part it adds: the first op's loads overlap nothing before them, and the
        tensors at the cut go through DRAM. On PP-OCR cls 1,000 to 6,400 cycles on vnpu-m
        depending on the layer (docs/mixed-precision.md); a model whose middle layer cuts nothing
        keeps 0."""
        kinds = {node_label(n): n.op_type for n in model.graph.node}
        macs = [u for u in layers.units if kinds.get(u) in MAC_OPS and u not in self.cpu_nodes]
        if not macs:
            return self
        table = {**{u: "int8" for u in layers.units}, macs[len(macs) // 2]: "float"}
        cut = compile_table(model, stats_meta, stats_arrays, settings, table, layers, fresh=False)
        added = device_parts(model.graph, self.on_npu(cut.integer_nodes))[1] - self.int8_cuts[1]
        if added <= 0:
            return self
        left = sum(self.int8.get(label, Busy()).span for label in self.int8_integer - cut.integer_nodes)
        grown = cut.stats["estimated_cycles"] - int8_stats["estimated_cycles"] + left
        return dataclasses.replace(self, part_start=max(grown, 0) / added)

    def on_npu(self, integer_nodes: set[str] | frozenset[str]) -> Callable[[str], bool]:
        """Which nodes a table runs on the NPU: every node but those the int8 compile already puts
        on the CPU and those the table keeps float (integer in the all-int8 plan, not in
        `integer_nodes`; an activation fused into its producer is in neither plan's list)."""
        made_float = self.int8_integer - integer_nodes
        return lambda label: label not in self.cpu_nodes and label not in made_float

    def cuts(self, graph: onnx.GraphProto, integer_nodes: set[str]) -> float:
        """What the float layers' cuts in the NPU program add to the int8 compile's cost: a
        hand-over each way per run of float layers the partition orders together (not per layer),
        and a start for each NPU part they add."""
        if not self.int8_integer - integer_nodes:
            return 0.0  # nothing left the NPU
        hand_overs, parts = device_parts(graph, self.on_npu(integer_nodes))
        transition = self.target.transition_us * self.target.clock_mhz
        added_parts = max(parts - self.int8_cuts[1], 0)
        return max(hand_overs - self.int8_cuts[0], 0) * transition + added_parts * self.part_start

    def op(
        self,
        label: str,
        op_type: str,
        input_16: bool,
        output_16: bool,
        input_share: float = 0.5,
        next_table: float | None = None,
    ) -> float:
        """An op's price at these widths. A MAC op is bound by the slower of its array time (the
        input's width sets the rate) and its DMA time, which grows with the bytes it moves in and
        out (`input_share`: the input's part of the elements it moves); the price is its int8
        span plus what that bound grows by. Other ops interpolate their int8 and int16 spans.
        `next_table`: when a lookup table reads the MAC op's result, that table's weight
        (`_table_weight`): the DMA brings the table in during the MAC op (constants load ahead of
        their op), so the int16 compile's MAC span holds the load of a 65,536-entry int16 table,
        which the table's own widths decide."""
        base, wide = self.int8.get(label, Busy()), self.int16.get(label, Busy())
        if op_type in MAC_OPS:
            # the span's growth at int16, split as its compute and DMA grew: compute by the input's
            # width, DMA by the widths of what it moves (and of the table it loads)
            compute, dma = max(wide.compute - base.compute, 0), max(wide.dma - base.dma, 0)
            moved = input_share * input_16 + (1.0 - input_share) * output_16
            table = 0.0
            if next_table is not None:
                table = min(dma, WIDE_TABLE_BYTES / self.target.dram_bytes_per_cycle)
            own = dma - table
            # the slower engine sets the span: the larger of the two growths these widths pay
            grown = max(compute * input_16, own * moved + table * (next_table or 0.0))
            weight = grown / max(compute, dma) if compute or dma else float(input_16)
        elif op_type in TABLE_OPS:
            weight = _table_weight(input_16, output_16)
        else:
            weight = (input_16 + output_16) / 2.0
        # 16 bits never run faster than 8: a shorter int16 span is the timeline's overlap shifting
        return base.span + max(wide.span - base.span, 0) * weight

    def float_layer(self, work: dict) -> float:
        """A layer moved to the CPU: its multiply-accumulates and the elements it reads and writes
        at the CPU's rates, in NPU cycles (the hand-overs around it: `cuts`)."""
        t = self.target
        ms = work["macs"] / (t.cpu_gmacs * 1e6) + work["bytes"] / (t.cpu_gelements * 1e6)
        return ms * t.clock_mhz * 1000.0

    def table_cycles(
        self,
        graph: onnx.GraphProto,
        tensor_bits: dict[str, int],
        integer_nodes: set[str],
        floats: list[dict],
        work: dict[str, dict],
        fine: set[str] = frozenset(),
    ) -> float:
        """The cost of a planned table: `tensor_bits`, `integer_nodes` and `fine` (its fine
        pre-activations) from the quantizer's plan, `floats` the work (stages/quantize/cost.op_work)
        of the layers the table keeps float, `work` every node's (the elements it reads and writes
        split a MAC op's DMA)."""
        total = self.fixed + sum(self.float_layer(w) for w in floats) + self.cuts(graph, integer_nodes)
        consumers = tensor_readers(graph.node)
        bits = {**tensor_bits, **{n: 8 for n in unstored_results(graph, fine)}}
        for node in graph.node:
            label = node_label(node)
            if label not in integer_nodes:
                continue
            ins = [bits[i] for i in node.input if i in bits]
            outs = [bits[o] for o in node.output if o in bits]
            by_input = node.op_type in MAC_OPS or node.op_type in TABLE_OPS
            data_input = bits.get(node.input[0]) if by_input else None
            done = work.get(label, {"bytes": 0, "elements": 0})
            moved_in, moved_out = done["bytes"] - done["elements"], done["elements"]
            readers = consumers.get(node.output[0], []) if node.op_type in MAC_OPS else []
            next_table = None
            if (
                len(readers) == 1
                and readers[0].op_type in TABLE_OPS
                and node_label(readers[0]) in integer_nodes
            ):
                (reader,) = readers
                next_table = _table_weight(bits.get(reader.input[0]) == 16, bits.get(reader.output[0]) == 16)
            total += self.op(
                label,
                node.op_type,
                (data_input if data_input is not None else max(ins, default=8)) == 16,
                max(outs, default=8) == 16,
                moved_in / (moved_in + moved_out) if moved_in + moved_out else 0.5,
                next_table,
            )
        return total


def _busy(stats: dict) -> dict[str, Busy]:
    """Each node's share of a compile's timeline (a node the code generator splits: summed)."""
    busy: dict[str, Busy] = {}
    for row in stats["layers"]:
        seen = busy.get(row["node"], Busy())
        busy[row["node"]] = Busy(
            seen.span + row["end"] - row["start"],
            seen.compute + row["compute_cycles"],
            seen.dma + row["dma_cycles"],
        )
    return busy


def _table_weight(input_16: bool, output_16: bool) -> float:
    """How much of an int16 table's price a table at these widths pays: its entries follow the
    input's width (65,536 for 16 bits), its bytes the output's."""
    return input_16 * (1.0 + output_16) / 2.0
