"""The precision search: per-layer precision that meets the accuracy goal at the least cost.

From all layers at the lowest candidate, layers are promoted in order of error removed per
cycle (the output noise a layer adds when it alone is quantized, over what promoting it one level
costs) to the next candidate up: the smallest prefix that meets the goal is found by doubling and
then bisection, each step verified by running the quantized model on the evaluation samples. A
budgeted fill in order of noise alone may beat that prefix. If every layer at one level is not
enough, the next level (float) is searched the same way on top. Then promoted layers are handed
back one level at a time, least sensitive first, wherever the goal still holds. The answer is the
cheapest table the integer model itself showed to meet the goal.

Each strategy is a function of a `Search` (what it measures with, where it logs, what it costs)
and of the goal it works to, which a round may raise above the user's.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from npubuild.stages.quantize.search.costs import Costs
from npubuild.stages.quantize.search.log import SearchLog
from npubuild.stages.quantize.search.measure import Measurer, Table, meets

LADDER = ("int8", "int16", "float")
CONFIRM_ATTEMPTS = 6
CONFIRM_ROUNDS = 3
HAND_BACK_RUNS = 48
CONFIRM_ACTION = "confirm on the integer model (golden interpreter)"
# Bisection steps over the cost budget of the noise-ordered fill (see budget_fill).
FILL_STEPS = 7


def levels_of(candidates: list[str]) -> list[str]:
    return [c for c in LADDER if c in candidates]


def search_order(rows: list[dict], costs: Costs) -> list[str]:
    """Most output noise removed per extra cycle first. A layer's noise is the power of the error
    it causes alone, 10^(-SQNR/10) of its "quantized alone" view; its price is the cost of moving
    it one level up (or the MACs it takes off int8). Cheap vector ops that hurt come before big
    convolutions that hurt as much."""
    levels, units = costs.levels, set(costs.units)

    def noise(row: dict) -> float:
        return 10.0 ** (-row["quantized_alone"]["sqnr_db"] / 10.0)

    def price(node: str) -> float:
        if costs.minimize == "non_int8_macs":
            return max(float(costs.work[node]["macs"]), 1.0)
        return max(costs.promotion(node, levels[min(1, len(levels) - 1)]), 1.0)

    scored = [(noise(r) / price(r["node"]), r["node"]) for r in rows if r["node"] in units]
    return [node for _, node in sorted(scored, key=lambda s: (-s[0], s[1]))]


@dataclass
class Search:
    measurer: Measurer
    costs: Costs
    log: SearchLog
    goal: dict
    noise_units: list[str] = field(default_factory=list)  # most output noise first, whatever the cost

    @property
    def units(self) -> list[str]:
        return self.costs.units

    @property
    def levels(self) -> list[str]:
        return self.costs.levels

    def evaluate(self, table: Table, action: str, goal: dict) -> bool:
        """Measure a table against `goal` (the working goal of this round)."""
        metrics = self.measurer.measure(table)
        if self.measurer.exact:
            self.measurer.golden_metrics(table)  # the integer model's own figure: confirmed if it passes
        return self.log.note(table, metrics, meets(metrics, goal), action)

    def judge(self, table: Table, action: str, goal: dict) -> bool:
        """Run a table on the integer model, against `goal` (the working goal of this round);
        a table with float layers on whatever measures the search (decided when the golden
        interpreter ran float layers in onnx's reference evaluator, far slower than onnxruntime;
        they run in onnxruntime since 0fd80a3, and the choice was not measured again)."""
        if "float" in table.values():
            return self.evaluate(table, action, goal)
        return self.confirm(table, action, goal)

    def confirm(self, table: Table, action: str = CONFIRM_ACTION, goal: dict | None = None) -> bool:
        """Run a table on the integer model, against `goal` (default: the user's)."""
        metrics = self.measurer.golden_metrics(table)
        return self.log.note(table, metrics, meets(metrics, self.goal if goal is None else goal), action)

    def prefix(self, base: Table, level: str, k: int) -> Table:
        table = dict(base)
        for u in self.units[:k]:
            table[u] = level
        return table


@dataclass
class Outcome:
    table: Table
    reached: bool
    metrics: dict  # the integer model's, when reached; else the best run's


def run(s: Search) -> Outcome:
    """Search with the probe, confirm on the integer model; where the probe was optimistic by
    some margin and no table is yet known to pass on the integer model, search again with the
    goal raised by that margin (at most CONFIRM_ROUNDS). The answer is the cheapest table the
    integer model itself showed to meet the goal, among all that were run on it (the budgeted
    fill runs on it directly, see budget_fill)."""
    goal = dict(s.goal)
    table: Table = {}
    for _ in range(CONFIRM_ROUNDS):
        found = search(s, goal)
        if found is None:
            break
        table = found
        if s.confirm(table) or s.measurer.confirmed_tables:
            # a table the integer model passed is already known (a fill's): another round at a
            # raised goal would rerun the whole search to perhaps shave a little off it
            return cheapest_confirmed(s)
        goal = raised(goal, s.measurer.measure(table), s.measurer.golden_metrics(table))
        if goal is None:
            break
    if not s.measurer.confirmed_tables and table:
        promote_until_confirmed(s, table)
    if s.measurer.confirmed_tables:
        return cheapest_confirmed(s)
    best = s.log.best
    return Outcome(best[0] if best else table, False, best[1] if best else {})


def cheapest_confirmed(s: Search) -> Outcome:
    # equal cost (a promotion the estimate prices at nothing): the fewer layers promoted
    table = min(
        s.measurer.confirmed_tables,
        key=lambda t: (s.costs.objective(t), sum(p != s.levels[0] for p in t.values())),
    )
    return Outcome(dict(table), True, s.measurer.golden_metrics(table))


def search(s: Search, goal: dict) -> Table | None:
    table = {u: s.levels[0] for u in s.units}
    if s.evaluate(table, f"all layers {s.levels[0]}", goal):
        return table
    for level in s.levels[1:]:
        found = prefix = smallest_prefix(s, table, level, goal)
        if found is not None:
            # each fill bisects its budget below what the prefix's table spends, not below the
            # other fill's answer: a fill is not monotone in its budget, and a ceiling set by the
            # other measure's answer sends the bisection elsewhere
            for spend in (s.costs.additive_cycles, s.costs.promoted_macs):
                filled = budget_fill(s, table, level, spend, spend(prefix), goal)
                if filled is not None and s.costs.objective(filled) < s.costs.objective(found):
                    found = filled
            if not meets(s.measurer.golden_metrics(found), goal):
                return found  # the integer model misses it: the caller raises the goal
            return hand_back(s, found, goal)
        table = s.prefix(table, level, len(s.units))
    return None


def smallest_prefix(s: Search, base: Table, level: str, goal: dict) -> Table | None:
    """The shortest prefix of the search order promoted to `level` that meets the goal."""
    n = len(s.units)
    low, high, k = 0, None, 1
    while k <= n:  # doubling: the first prefix length that meets the goal
        if s.evaluate(s.prefix(base, level, k), f"{k} most sensitive layers {level}", goal):
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
        if s.evaluate(s.prefix(base, level, mid), f"{mid} most sensitive layers {level}", goal):
            high = mid
        else:
            low = mid
    return s.prefix(base, level, high)


def budget_fill(s: Search, base: Table, level: str, spend, ceiling: float, goal: dict) -> Table | None:
    """The other way to spend a budget: walk the layers in order of the noise each adds alone
    (not per cycle) and promote every one that still fits a budget of `spend` (estimated cycles,
    or MACs taken off int8), skipping those that do not; bisect the budget below `ceiling` (what
    the prefix search's table spends). Where the noisiest layers are cheap vector ops and a few
    huge convolutions hurt less, this keeps those big convolutions at the lower level, which a
    prefix of the per-cycle order cannot. The caller keeps a filled table only when it is cheaper
    by the search's objective. An int16 fill runs on the integer model against the goal itself:
    the fill lands where the goal only just holds, which is where the probe's small optimism
    would make it miss."""
    if not s.noise_units:
        return None
    low, high = spend(base), ceiling
    best = None
    for _ in range(FILL_STEPS):
        budget = (low + high) / 2
        table, spent = dict(base), spend(base)
        for u in s.noise_units:
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
            s.evaluate(table, action, goal)
            if level == "float"
            else s.confirm(table, action + " (integer model)")
        )
        if passed:
            best, high = table, spent
        else:
            low = budget
    return best


def hand_back(s: Search, table: Table, goal: dict) -> Table:
    """Lower promoted layers one level where the goal still holds: least sensitive first, in
    blocks that are split in halves when they fail, so layers that can all go back cost one
    run, not one run each. At most HAND_BACK_RUNS runs, each on the integer model whatever
    measures the rest of the search: its steps decide by margins of ~1e-3, the size of the probe's
    error (PP-OCRv4 det at 480, goal 0.99: the probe found the fill's table 0.002 short of the
    goal the integer model passed, and judged by it, no layer went back: 128 layers above int8,
    1.53x the int8 latency)."""
    budget = [HAND_BACK_RUNS]

    def lower(t: Table, block: list[str]) -> Table:
        return {**t, **{u: s.levels[s.levels.index(t[u]) - 1] for u in block}}

    def attempt(t: Table, block: list[str]) -> Table:
        if not block or budget[0] <= 0:
            return t
        budget[0] -= 1
        trial = lower(t, block)
        label = block[0] if len(block) == 1 else f"{len(block)} layers ({block[0]} ...)"
        if s.judge(trial, f"hand {label} back one level", goal):
            return trial
        if len(block) == 1:
            return t
        half = len(block) // 2
        return attempt(attempt(t, block[:half]), block[half:])

    for _ in range(len(s.levels) - 1):  # float -> int16 -> int8 takes two passes
        promoted = [u for u in reversed(s.units) if table[u] != s.levels[0]]
        if not promoted or budget[0] <= 0:
            break
        table = attempt(table, promoted)
    return table


def promote_until_confirmed(s: Search, table: Table) -> None:
    """Last resort when the probe was optimistic on every round: promote the next most
    sensitive layers one at a time until the integer model meets the goal (a table it passes
    is confirmed)."""
    for _ in range(CONFIRM_ATTEMPTS):
        if s.confirm(table):
            return
        nxt = next((u for u in s.units if table[u] != s.levels[-1]), None)
        if nxt is None:
            return
        table = {**table, nxt: s.levels[s.levels.index(table[nxt]) + 1]}
        s.log.record(table, s.measurer.estimate(table), None, f"promote {nxt} to {table[nxt]}")


def raised(goal: dict, estimate: dict, golden: dict) -> dict | None:
    """The goal raised by how much the probe overestimated the integer model (None when that
    leaves nothing to search for)."""
    out = dict(goal)
    if goal.get("cosine") is not None:
        margin = max(estimate["cosine"] - golden["cosine"], 0.0)
        out["cosine"] = goal["cosine"] + margin + 0.1 * (1 - goal["cosine"])
        if out["cosine"] >= 1.0:
            return None
    if goal.get("sqnr") is not None:
        out["sqnr"] = goal["sqnr"] + max(estimate["sqnr_db"] - golden["sqnr_db"], 0.0) + 0.1
    return out
