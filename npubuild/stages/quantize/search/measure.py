"""Measuring precision tables: each distinct table runs once, on the precision probe (a QDQ twin
of the integer model in onnxruntime, fast) or on the golden interpreter (the integer model itself,
exact). Tables the integer model showed to meet the goal are kept: the search's answer is the
cheapest of them."""

from __future__ import annotations

import time
from typing import Protocol

# The search measures with the golden interpreter instead of the probe when one run of it takes at
# most this many times the probe's, or this many seconds: the probe's float rounding differs from
# the integer model by ~1e-3 in cosine on small nets, as much as the margin a goal like 0.999 leaves.
EXACT_RATIO, EXACT_SECONDS = 3.0, 2.0

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
    def __init__(self, probe: Probe, goal: dict, exact: bool | None = None):
        self.probe, self.goal = probe, goal
        self.exact = exact  # measure with the integer model itself (None: decide on the first run)
        self.measured: dict[tuple, dict] = {}
        self.golden: dict[tuple, dict] = {}
        self.confirmed_tables: list[Table] = []

    def measure(self, table: Table) -> dict:
        """The metrics of a table: from the integer model itself when running it costs little
        more than the probe, else from the probe."""
        key = promoted(table)
        if key not in self.measured:
            if self.exact is None:
                started = time.perf_counter()
                estimate = self.probe.run(dict(key))
                probe_seconds = time.perf_counter() - started
                started = time.perf_counter()
                golden = self.probe.confirm(dict(key))
                golden_seconds = time.perf_counter() - started
                self.exact = golden_seconds <= max(EXACT_RATIO * probe_seconds, EXACT_SECONDS)
                self.measured[key] = golden if self.exact else estimate
            else:
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
