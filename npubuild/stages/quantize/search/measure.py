"""Measuring precision tables: each distinct table runs once, on the precision probe (a QDQ twin
of the integer model in onnxruntime, fast) or on the golden interpreter (the integer model itself,
exact). Tables the integer model showed to meet the goal are kept: the search's answer is the
cheapest of them."""

from __future__ import annotations

from typing import Protocol

# The search measures every table with the golden interpreter instead of the probe when one run of
# it is cheap: at most this many activation elements (every op's output, per sample, times the
# samples searched on). The probe's float rounding differs from the integer model by ~1e-3 in
# cosine on small nets, as much as the margin a goal like 0.999 leaves; on large ones the golden
# interpreter costs 3x the probe per run (PP-OCRv4 det at 480, 51M elements x 8 samples: search
# 146 s with it, 69 s with the probe and golden confirmations, an equally cheap table that holds as
# well on the held-out images). Decided from the model, never from timing: the same inputs must
# give the same table on any machine.
EXACT_ELEMENTS = 200_000_000


def golden_is_cheap(work: dict[str, dict], samples: int) -> bool:
    """Whether the search measures every table on the integer model itself (`work`: op_work's)."""
    return sum(w["elements"] for w in work.values()) * samples <= EXACT_ELEMENTS


Table = dict[str, str]  # layer -> precision ("int8", "int16", "float")


class Probe(Protocol):
    """What the search needs of the precision probe (stages/quantize/probe.py)."""

    mac_input_bits: dict[str, int]

    def plan(self, table: Table): ...

    def run(self, table: Table) -> dict: ...

    def confirm(self, table: Table) -> dict: ...


def meets(metrics: dict, goal: dict) -> bool:
    if goal.get("cosine") is not None and metrics["cosine"] < goal["cosine"]:
        return False
    return not (goal.get("sqnr") is not None and metrics["sqnr_db"] < goal["sqnr"])


def promoted(table: Table) -> tuple[tuple[str, str], ...]:
    """A table by its layers above int8: the key each measured table is kept under."""
    return tuple(sorted((u, p) for u, p in table.items() if p != "int8"))


class Measurer:
    def __init__(self, probe: Probe, goal: dict, exact: bool):
        self.probe, self.goal = probe, goal
        self.exact = exact  # measure every table with the integer model itself (golden_is_cheap)
        self.measured: dict[tuple, dict] = {}
        self.golden: dict[tuple, dict] = {}
        self.confirmed_tables: list[Table] = []

    def measure(self, table: Table) -> dict:
        """The metrics of a table: from the integer model itself when that is cheap, else from
        the probe."""
        key = promoted(table)
        if key not in self.measured:
            self.measured[key] = (self.probe.confirm if self.exact else self.probe.run)(dict(key))
        return self.measured[key]

    def golden_metrics(self, table: Table) -> dict:
        """The integer model's own metrics for a table; one that meets the goal is confirmed."""
        key = promoted(table)
        if self.exact:
            metrics = self.measure(table)
        else:
            if key not in self.golden:
                self.golden[key] = self.probe.confirm(dict(key))
            metrics = self.golden[key]
        if meets(metrics, self.goal) and table not in self.confirmed_tables:
            self.confirmed_tables.append(dict(table))
        return metrics

    def estimate(self, table: Table) -> dict:
        """One probe run, not remembered (a last-resort promotion's record)."""
        return self.probe.run(dict(promoted(table)))
