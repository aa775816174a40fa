"""The search's path: every run with its action, metrics, cost and verdict, and the best result
seen (what an unreachable goal reports)."""

from __future__ import annotations

from npubuild.stages.quantize.search.costs import Costs
from npubuild.stages.quantize.search.measure import Table


class SearchLog:
    def __init__(self, costs: Costs, goal: dict):
        self.costs, self.goal = costs, goal
        self.path: list[dict] = []
        self.best: tuple[Table, dict] | None = None

    def note(self, table: Table, metrics: dict, ok: bool, action: str) -> bool:
        """A run into the path, and into the best result seen."""
        self.record(table, metrics, ok, action)
        if self.best is None or _better(metrics, self.best[1], self.goal):
            self.best = (dict(table), metrics)
        return ok

    def record(self, table: Table, metrics: dict, ok: bool | None, action: str) -> None:
        self.path.append(
            {
                "step": len(self.path) + 1,
                "action": action,
                "cosine": round(metrics["cosine"], 6),
                "sqnr_db": round(metrics["sqnr_db"], 3),
                "cost": round(self.costs.cycles(table)),
                "int8_mac_share": round(self.costs.int8_mac_share(table), 4),
                "goal_met": ok,
                "non_base_layers": sum(1 for p in table.values() if p != self.costs.levels[0]),
            }
        )


def _better(a: dict, b: dict, goal: dict) -> bool:
    key = "sqnr_db" if goal.get("cosine") is None else "cosine"
    return a[key] > b[key]
