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
keeps float pays the CPU model's cost (targets/cpu_cost.py) and two hand-overs; what the all-int8
compile already runs on the CPU (the input's quantize, unsupported ops) is a fixed cost. The
result is in NPU cycles of estimated latency, the figure codegen reports as
`estimated_latency_ms`; tests/test_search_prices.py compiles tables and compares.
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx

from npubuild.intmodel.ops import LUT_OPS, MAC_OPS, TABULATED_OPS
from npubuild.intmodel.program import parse
from npubuild.stages.onnx_utils import tensor_readers
from npubuild.stages.quantize.graphinfo import node_label
from npubuild.stages.quantize.integer_model import build_integer_model
from npubuild.stages.quantize.precision import Layers, precision_overrides
from npubuild.targets.compile import compile_npub, plan_partition
from npubuild.targets.spec import TargetSpec

HAND_OVERS_PER_FLOAT_LAYER = 2  # to the CPU and back
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


def compile_table(
    model: onnx.ModelProto,
    stats_meta: dict,
    stats_arrays: dict,
    settings: dict,
    table: dict,
    layers: Layers,
    fresh: bool = True,
) -> dict:
    """codegen's statistics (codegen.json's figures) for a precision table on the target, built
    as the build builds it: integer model, partition, code generation (without fresh constants
    where `fresh` is False: `Prices.compiled`)."""
    target = TargetSpec.model_validate(settings["target"])
    quantize = table_settings(settings, table, layers)
    _, meta, arrays = build_integer_model(model, stats_meta, stats_arrays, quantize)
    program = parse(meta, "the integer model of a precision table")
    plan = plan_partition(program, arrays, model, target)
    _, _, stats = compile_npub(program, arrays, model, target, plan, fresh=fresh)
    return stats


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
    fixed: float  # cycles of the int8 compile's latency off the NPU timeline (CPU ops, hand-overs)
    target: TargetSpec

    @classmethod
    def compiled(
        cls,
        model: onnx.ModelProto,
        stats_meta: dict,
        stats_arrays: dict,
        settings: dict,
        layers: Layers,
        with_int16: bool = True,
    ) -> Prices:
        """Compile every layer at int8 and, when a table may hold int16 layers, every layer at
        int16 (`settings`: quantize, target)."""
        target = TargetSpec.model_validate(settings["target"])
        busy: dict[int, dict[str, Busy]] = {}
        fixed = 0.0
        for width in (8, 16) if with_int16 else (8,):
            # without fresh constants: a fresh binary's constant loads run far ahead of their op,
            # so its per-op spans overlap and do not add up (docs/mixed-precision.md)
            every = {u: f"int{width}" for u in layers.units}
            stats = compile_table(model, stats_meta, stats_arrays, settings, every, layers, fresh=False)
            busy[width] = {}
            for row in stats["layers"]:
                seen = busy[width].get(row["node"], Busy())
                busy[width][row["node"]] = Busy(
                    seen.span + row["end"] - row["start"],
                    seen.compute + row["compute_cycles"],
                    seen.dma + row["dma_cycles"],
                )
            if width == 8:
                fixed = latency_cycles(stats, target) - sum(b.span for b in busy[8].values())
        return cls(busy[8], busy.get(16, busy[8]), fixed, target)

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
        at the CPU's rates, and the two hand-overs around it, in NPU cycles."""
        t = self.target
        ms = work["macs"] / (t.cpu_gmacs * 1e6) + work["bytes"] / (t.cpu_gelements * 1e6)
        ms += HAND_OVERS_PER_FLOAT_LAYER * t.transition_us / 1000.0
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
        total = self.fixed + sum(self.float_layer(w) for w in floats)
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


def _table_weight(input_16: bool, output_16: bool) -> float:
    """How much of an int16 table's price a table at these widths pays: its entries follow the
    input's width (65,536 for 16 bits), its bytes the output's."""
    return input_16 * (1.0 + output_16) / 2.0
