"""What a precision table costs on the target: the code generator's estimated latency, priced
from its own timeline (prices.py), or the MACs that leave int8."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from npubuild.stages.quantize.search.measure import Probe, Table, promoted

Price = Callable[[Table], float]  # a table's estimated latency in NPU cycles


def planned_price(probe, prices, work: dict) -> Price:
    """A table's price: the quantizer plans it (which tensors are 16-bit, which layers integer)
    and the price list of the compiled references sums its ops (prices.Prices)."""

    def price(table: Table) -> float:
        _, integer_nodes = probe.plan(table)
        floats = [work[u] for u, p in table.items() if p == "float"]
        return prices.table_cycles(
            probe.model.graph, probe.tensor_bits, integer_nodes, floats, work, probe.fine_preactivations
        )

    return price


@dataclass
class Costs:
    probe: Probe
    units: list[str]
    levels: list[str]
    work: dict  # layer -> {"macs", "elements", ...} (cost.op_work)
    price: Price
    minimize: str = "cycles"  # or "non_int8_macs"
    _cycles: dict = field(default_factory=dict)

    def effective(self, table: Table) -> Table:
        """The precision each layer runs at: a MAC left at int8 that reads a 16-bit tensor (its
        producer was promoted) runs at the int16 rate, and is counted so."""
        self.probe.plan({u: p for u, p in table.items() if p != "int8"})
        out = {}
        for u in self.units:
            p = table.get(u, self.levels[0])
            if p == "int8" and self.probe.mac_input_bits.get(u) == 16:
                p = "int16"
            out[u] = p
        return out

    def cycles(self, table: Table) -> float:
        """The table's estimated latency, as codegen would estimate it (each table priced once)."""
        key = promoted(table)
        if key not in self._cycles:
            self._cycles[key] = self.price(dict(key))
        return self._cycles[key]

    def promotion(self, unit: str, level: str) -> float:
        """What moving one layer alone from int8 to `level` costs."""
        return self.cycles({unit: level}) - self.cycles({})

    def additive_cycles(self, table: Table) -> float:
        """The all-int8 cost plus each promoted layer's own promotion price: what a budget walks
        with, one layer at a time, without pricing every trial table whole."""
        return self.cycles({}) + sum(self.promotion(u, p) for u, p in table.items() if p != "int8")

    def promoted_macs(self, table: Table) -> float:
        """MACs that do not run at int8 (a layer reading a 16-bit tensor included)."""
        runs_at = self.effective(table)
        return float(sum(self.work[u]["macs"] for u in self.units if runs_at[u] != "int8"))

    def int8_mac_share(self, table: Table) -> float:
        total = sum(self.work[u]["macs"] for u in self.units)
        return 1.0 - self.promoted_macs(table) / total if total else 1.0

    def objective(self, table: Table) -> float:
        """What the search minimises: estimated cycles, or MACs off int8 (cycles break ties)."""
        if self.minimize == "non_int8_macs":
            return self.promoted_macs(table) + self.cycles(table) * 1e-9
        return self.cycles(table)
