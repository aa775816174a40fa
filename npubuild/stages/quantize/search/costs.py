"""What a precision table costs on the target: estimated cycles of every layer at the precision it
really runs at, or the MACs that leave int8."""

from __future__ import annotations

from dataclasses import dataclass

from npubuild.stages.quantize.cost import layer_cost
from npubuild.stages.quantize.search.measure import Probe, Table


@dataclass
class Costs:
    probe: Probe
    units: list[str]
    levels: list[str]
    work: dict  # layer -> {"macs", "elements", ...} (cost.op_work)
    target: dict
    minimize: str = "cycles"  # or "non_int8_macs"

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
        runs_at = self.effective(table)
        return sum(layer_cost(self.work[u], runs_at[u], self.target) for u in self.units)

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
