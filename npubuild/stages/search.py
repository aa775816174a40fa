"""search: per-layer precision that meets the accuracy goal at the least estimated cost.

From all layers at the lowest candidate, layers are promoted in order of error removed per
cycle (the output noise a layer adds when it alone is quantized, over what promoting it one level
costs) to the next candidate up: the smallest prefix that meets the goal is found by
doubling and then bisection, each step verified by running the quantized model (the precision
probe) on the evaluation samples. If every layer at one level is not enough, the next level
(float) is searched the same way on top. Then promoted layers are handed back one level at a
time, least sensitive first, wherever the goal still holds. Every run is recorded in the path.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from npubuild.errors import UserError
from npubuild.intmodel import tensorfile
from npubuild.stages.feeds import SampleFile, iterate_feeds
from npubuild.stages.onnx_utils import load_model, write_json
from npubuild.stages.quantize.cost import layer_cost, op_work
from npubuild.stages.quantize.probe import PrecisionProbe

LADDER = ("int8", "int16", "float")
CONFIRM_ATTEMPTS = 6
CONFIRM_ROUNDS = 3
# The search measures with the golden interpreter instead of the probe when one run of it takes at
# most this many times the probe's, or this many seconds: the probe's float rounding differs from
# the integer model by ~1e-3 in cosine on small nets, as much as the margin a goal like 0.999 leaves.
EXACT_RATIO, EXACT_SECONDS = 3.0, 2.0
HAND_BACK_RUNS = 48
CONFIRM_ACTION = "confirm on the integer model (golden interpreter)"
# Bisection steps over the cost budget of the noise-ordered fill (see Search.budget_fill).
FILL_STEPS = 7


def search_order(
    rows: list[dict], work: dict, target: dict, levels: list[str], minimize: str = "cycles"
) -> list[str]:
    """Most output noise removed per extra cycle first. A layer's noise is the power of the error
    it causes alone, 10^(-SQNR/10) of its "quantized alone" view; its price is the cost of moving
    it one level up. Cheap vector ops that hurt come before big convolutions that hurt as much."""

    def noise(row: dict) -> float:
        return 10.0 ** (-row["quantized_alone"]["sqnr_db"] / 10.0)

    def price(node: str) -> float:
        if minimize == "non_int8_macs":
            return max(float(work[node]["macs"]), 1.0)
        up = layer_cost(work[node], levels[min(1, len(levels) - 1)], target) - layer_cost(
            work[node], levels[0], target
        )
        return max(up, 1.0)

    scored = [(noise(r) / price(r["node"]), r["node"]) for r in rows if r["node"] in work]
    return [node for _, node in sorted(scored, key=lambda s: (-s[0], s[1]))]


def meets(metrics: dict, goal: dict) -> bool:
    if goal.get("cosine") is not None and metrics["cosine"] < goal["cosine"]:
        return False
    return not (goal.get("sqnr") is not None and metrics["sqnr_db"] < goal["sqnr"])


class Search:
    def __init__(
        self,
        probe: PrecisionProbe,
        ranking: list[str],
        goal: dict,
        candidates: list[str],
        target: dict,
        work: dict,
        noise_ranking: list[str] | None = None,
        minimize: str = "cycles",
    ):
        self.minimize = minimize
        self.probe, self.goal, self.target, self.work = probe, goal, target, work
        self.units = [u for u in ranking if u in set(probe.layers.units)]
        # most output noise first, whatever the cost: the order of the budgeted fill
        self.noise_units = [u for u in (noise_ranking or []) if u in set(self.units)]
        self.levels = _levels(candidates)
        self.path: list[dict] = []
        self.best: tuple[dict, dict] | None = None
        self.working_goal = dict(goal)
        self.measured: dict[tuple, dict] = {}
        self.exact: bool | None = None  # measure with the integer model itself (small models)
        self.final: dict | None = None
        self.golden: dict[tuple, dict] = {}
        # every table the integer model itself showed to meet the goal: the answer is the cheapest
        self.confirmed_tables: list[dict[str, str]] = []

    def effective(self, table: dict[str, str]) -> dict[str, str]:
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

    def cost(self, table: dict[str, str]) -> float:
        runs_at = self.effective(table)
        return sum(layer_cost(self.work[u], runs_at[u], self.target) for u in self.units)

    def int8_mac_share(self, table: dict[str, str]) -> float:
        total = sum(self.work[u]["macs"] for u in self.units)
        return 1.0 - self.promoted_macs(table) / total if total else 1.0

    def measure(self, table: dict[str, str]) -> dict:
        """The metrics of a table (each distinct table is run once): from the integer model itself
        when running it costs little more than the probe, else from the probe."""
        key = _promoted(table)
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

    def golden_metrics(self, table: dict[str, str]) -> dict:
        """The integer model's own metrics for a table (each distinct table is run once)."""
        key = _promoted(table)
        if self.exact:
            metrics = self.measure(table)
        else:
            if key not in self.golden:
                self.golden[key] = self.probe.confirm(dict(key))
            metrics = self.golden[key]
        if meets(metrics, self.goal) and table not in self.confirmed_tables:
            self.confirmed_tables.append(dict(table))
        return metrics

    def confirm(self, table: dict[str, str], action: str = CONFIRM_ACTION) -> bool:
        metrics = self.golden_metrics(table)
        return self.note(table, metrics, meets(metrics, self.goal), action)

    def evaluate(self, table: dict[str, str], action: str) -> bool:
        metrics = self.measure(table)
        if self.exact:
            self.golden_metrics(table)  # the integer model's own figure: a confirmed table if it passes
        return self.note(table, metrics, meets(metrics, self.working_goal), action)

    def note(self, table: dict[str, str], metrics: dict, ok: bool, action: str) -> bool:
        """A run into the path, and into the best result seen (for an unreachable goal's report)."""
        self.record(table, metrics, ok, action)
        if self.best is None or _better(metrics, self.best[1], self.goal):
            self.best = (dict(table), metrics)
        return ok

    def record(self, table: dict[str, str], metrics: dict, ok: bool, action: str) -> None:
        self.path.append(
            {
                "step": len(self.path) + 1,
                "action": action,
                "cosine": round(metrics["cosine"], 6),
                "sqnr_db": round(metrics["sqnr_db"], 3),
                "cost": round(self.cost(table)),
                "int8_mac_share": round(self.int8_mac_share(table), 4),
                "goal_met": ok,
                "non_base_layers": sum(1 for p in table.values() if p != self.levels[0]),
            }
        )

    def prefix(self, base: dict[str, str], level: str, k: int) -> dict[str, str]:
        table = dict(base)
        for u in self.units[:k]:
            table[u] = level
        return table

    def run(self) -> tuple[dict[str, str], bool]:
        """Search with the probe, confirm on the integer model; where the probe was optimistic by
        some margin and no table is yet known to pass on the integer model, search again with the
        goal raised by that margin (at most CONFIRM_ROUNDS). The answer is the cheapest table the
        integer model itself showed to meet the goal, among all that were run on it (the budgeted
        fill runs on it directly, see budget_fill)."""
        goal = dict(self.goal)
        table: dict[str, str] = {}
        for _ in range(CONFIRM_ROUNDS):
            self.working_goal = goal
            found = self.search()
            if found is None:
                break
            table = found
            if self.confirm(table) or self.confirmed_tables:
                # a table the integer model passed is already known (a fill's): another round at a
                # raised goal would rerun the whole search to perhaps shave a little off it
                return self.cheapest_confirmed()
            goal = _raised(goal, self.measure(table), self.golden_metrics(table))
            if goal is None:
                break
        self.working_goal = self.goal
        if not self.confirmed_tables and table:
            self.promote_until_confirmed(table)
        if self.confirmed_tables:
            return self.cheapest_confirmed()
        return (self.best[0] if self.best else table), False

    def cheapest_confirmed(self) -> tuple[dict[str, str], bool]:
        # equal cost (a promotion the estimate prices at nothing): the fewer layers promoted
        table = min(
            self.confirmed_tables,
            key=lambda t: (self.objective(t), sum(p != self.levels[0] for p in t.values())),
        )
        self.final = self.golden_metrics(table)
        return dict(table), True

    def search(self) -> dict[str, str] | None:
        table = {u: self.levels[0] for u in self.units}
        if self.evaluate(table, f"all layers {self.levels[0]}"):
            return table
        for level in self.levels[1:]:
            found = self.smallest_prefix(table, level)
            if found is not None:
                for spend in (self.cost, self.promoted_macs):
                    filled = self.budget_fill(table, level, spend, spend(found))
                    if filled is not None and self.objective(filled) < self.objective(found):
                        found = filled
                if not meets(self.measure(found), self.working_goal):
                    # a fill the integer model passed but the probe does not: every hand-back
                    # step, judged by the probe, would fail
                    return found
                return self.hand_back(found)
            table = self.prefix(table, level, len(self.units))
        return None

    def objective(self, table: dict[str, str]) -> float:
        """What the search minimises: estimated cycles, or MACs off int8 (cycles break ties)."""
        if self.minimize == "non_int8_macs":
            return self.promoted_macs(table) + self.cost(table) * 1e-9
        return self.cost(table)

    def promoted_macs(self, table: dict[str, str]) -> float:
        """MACs that do not run at int8 (a layer reading a 16-bit tensor included)."""
        runs_at = self.effective(table)
        return float(sum(self.work[u]["macs"] for u in self.units if runs_at[u] != "int8"))

    def budget_fill(self, base: dict[str, str], level: str, spend, ceiling: float) -> dict[str, str] | None:
        """The other way to spend a budget: walk the layers in order of the noise each adds alone
        (not per cycle) and promote every one that still fits a budget of `spend` (estimated
        cycles, or MACs taken off int8), skipping those that do not; bisect the budget below
        `ceiling` (what the prefix search's table spends). Where the noisiest layers are cheap
        vector ops and a few huge convolutions hurt less, this keeps those big convolutions at the
        lower level, which a prefix of the per-cycle order cannot. The caller keeps a filled
        table only when it is cheaper by the search's objective. An int16 fill runs on the
        integer model against the goal itself: the fill lands where the goal only just holds,
        which is where the probe's small optimism would make it miss."""
        if not self.noise_units:
            return None
        low, high = spend(base), ceiling
        best = None
        for _ in range(FILL_STEPS):
            budget = (low + high) / 2
            table, spent = dict(base), spend(base)
            for u in self.noise_units:
                if table[u] != base[u]:
                    continue
                trial = {**table, u: level}
                trial_spend = spend(trial)
                if trial_spend <= budget:
                    table, spent = trial, trial_spend
            if table == base:
                low = budget
                continue
            action = f"noisiest layers {level} within a budget of {budget:,.0f}"
            # float layers run in the golden interpreter's reference evaluator, far slower than
            # onnxruntime: a float-level fill stays on the probe
            passed = (
                self.evaluate(table, action)
                if level == "float"
                else self.confirm(table, action + " (integer model)")
            )
            if passed:
                best, high = table, spent
            else:
                low = budget
        return best

    def promote_until_confirmed(self, table: dict[str, str]) -> None:
        """Last resort when the probe was optimistic on every round: promote the next most
        sensitive layers one at a time until the integer model meets the goal (a table it passes
        joins confirmed_tables)."""
        for _ in range(CONFIRM_ATTEMPTS):
            if self.confirm(table):
                return
            nxt = next((u for u in self.units if table[u] != self.levels[-1]), None)
            if nxt is None:
                return
            table = {**table, nxt: self.levels[self.levels.index(table[nxt]) + 1]}
            self.record(
                table,
                self.probe.run(dict(_promoted(table))),
                None,
                f"promote {nxt} to {table[nxt]}",
            )

    def smallest_prefix(self, base: dict[str, str], level: str) -> dict[str, str] | None:
        n = len(self.units)
        low, high, k = 0, None, 1
        while k <= n:  # doubling: the first prefix length that meets the goal
            if self.evaluate(self.prefix(base, level, k), f"{k} most sensitive layers {level}"):
                high = k
                break
            low = k
            k = n if k < n and 2 * k > n else 2 * k
            if low == n:
                break
        if high is None:
            return None
        while high - low > 1:  # bisection between a failing and a passing length
            mid = (low + high) // 2
            if self.evaluate(self.prefix(base, level, mid), f"{mid} most sensitive layers {level}"):
                high = mid
            else:
                low = mid
        return self.prefix(base, level, high)

    def hand_back(self, table: dict[str, str]) -> dict[str, str]:
        """Lower promoted layers one level where the goal still holds: least sensitive first, in
        blocks that are split in halves when they fail, so layers that can all go back cost one
        run, not one run each. At most HAND_BACK_RUNS runs."""
        budget = [HAND_BACK_RUNS]

        def lower(t: dict[str, str], block: list[str]) -> dict[str, str]:
            return {**t, **{u: self.levels[self.levels.index(t[u]) - 1] for u in block}}

        def attempt(t: dict[str, str], block: list[str]) -> dict[str, str]:
            if not block or budget[0] <= 0:
                return t
            budget[0] -= 1
            trial = lower(t, block)
            label = block[0] if len(block) == 1 else f"{len(block)} layers ({block[0]} ...)"
            if self.evaluate(trial, f"hand {label} back one level"):
                return trial
            if len(block) == 1:
                return t
            half = len(block) // 2
            return attempt(attempt(t, block[:half]), block[half:])

        for _ in range(len(self.levels) - 1):  # float -> int16 -> int8 takes two passes
            promoted = [u for u in reversed(self.units) if table[u] != self.levels[0]]
            if not promoted or budget[0] <= 0:
                break
            table = attempt(table, promoted)
        return table


def _raised(goal: dict, estimate: dict, golden: dict) -> dict | None:
    """The goal raised by how much the probe overestimated the integer model (None when that
    leaves nothing to search for)."""
    raised = dict(goal)
    if goal.get("cosine") is not None:
        margin = max(estimate["cosine"] - golden["cosine"], 0.0)
        raised["cosine"] = goal["cosine"] + margin + 0.1 * (1 - goal["cosine"])
        if raised["cosine"] >= 1.0:
            return None
    if goal.get("sqnr") is not None:
        raised["sqnr"] = goal["sqnr"] + max(estimate["sqnr_db"] - golden["sqnr_db"], 0.0) + 0.1
    return raised


def _promoted(table: dict[str, str]) -> tuple[tuple[str, str], ...]:
    """A table by its layers above int8: the key each measured table is kept under."""
    return tuple(sorted((u, p) for u, p in table.items() if p != "int8"))


def _levels(candidates: list[str]) -> list[str]:
    return [c for c in LADDER if c in candidates]


def _better(a: dict, b: dict, goal: dict) -> bool:
    key = "sqnr_db" if goal.get("cosine") is None else "cosine"
    return a[key] > b[key]


def run(params: dict, inputs: dict[str, Path], outdir: Path) -> dict[str, Path]:
    model = load_model(inputs["model"], "the optimized model")
    stats_arrays, stats = tensorfile.load(inputs["stats"])
    sensitivity = json.loads(Path(inputs["sensitivity"]).read_text())
    feeds = list(iterate_feeds(model, SampleFile(inputs["evaluation"]), params["samples"]))
    probe = PrecisionProbe(model, stats["tensors"], stats_arrays, params["quantize"], feeds)
    work = op_work(model)
    by_noise = sorted(sensitivity["layers"], key=lambda r: (r["quantized_alone"]["sqnr_db"], r["node"]))
    search = Search(
        probe,
        search_order(
            sensitivity["layers"],
            work,
            params["target"],
            _levels(params["candidates"]),
            params.get("minimize", "cycles"),
        ),
        params["goal"],
        params["candidates"],
        params["target"],
        work,
        noise_ranking=[r["node"] for r in by_noise],
        minimize=params.get("minimize", "cycles"),
    )
    table, reached = search.run()
    final_metrics = search.final if reached else search.best[1]
    all_base = {u: search.levels[0] for u in search.units}
    summary = {
        "goal": params["goal"],
        "minimize": search.minimize,
        "candidates": search.levels,
        "reached": reached,
        "cosine": final_metrics["cosine"],
        "sqnr_db": final_metrics["sqnr_db"],
        "int8_mac_share": search.int8_mac_share(table),
        "runs_at": search.effective(table),
        "cost": round(search.cost(table)),
        "cost_all_base": round(search.cost(all_base)),
        "precision": {u: table[u] for u in search.units},
        "macs": {u: work[u]["macs"] for u in search.units},
        "path": search.path,
        "search_order": search.units,
        "samples": len(feeds),
        "warnings": []
        if reached
        else [
            f"goal {params['goal']} not reached; best found: cosine {final_metrics['cosine']:.5f}, "
            f"SQNR {final_metrics['sqnr_db']:.2f} dB"
        ],
    }
    if not reached and params["enforce"]:
        best = f"cosine {final_metrics['cosine']:.5f}, SQNR {final_metrics['sqnr_db']:.2f} dB"
        raise UserError(
            f"mixed precision goal {params['goal']} is not reachable with {search.levels}: "
            f"best found {best} after {len(search.path)} runs"
        )
    table_path = write_json(
        outdir / "precision.json",
        {
            "version": 1,
            "layers": {u: p for u, p in sorted(table.items()) if p != "int8"},
        },
    )
    return {"table": table_path, "summary": write_json(outdir / "search.json", summary)}
