"""search: per-layer precision that meets the accuracy goal at the least estimated cost.

The search looks at the even-numbered evaluation samples only; the odd-numbered ones are held out
and judge its answer: a goal is met when the held-out images meet it (docs/mixed-precision.md).

The search itself is stages/quantize/search/ (strategies, measurer, costs, log); this stage reads
its inputs, runs it, and writes the precision table and the report of every run.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from npubuild.errors import UserError
from npubuild.intmodel import tensorfile
from npubuild.stages.feeds import SampleFile, iterate_feeds, search_split
from npubuild.stages.onnx_utils import load_model, write_json
from npubuild.stages.quantize.cost import op_work
from npubuild.stages.quantize.probe import PrecisionProbe
from npubuild.stages.quantize.search import strategies
from npubuild.stages.quantize.search.costs import Costs, planned_price
from npubuild.stages.quantize.search.log import SearchLog
from npubuild.stages.quantize.search.measure import Measurer, golden_is_cheap, meets
from npubuild.stages.quantize.search.prices import Prices
from npubuild.stages.wording import goal_text, metrics_text


def run(params: dict, inputs: dict[str, Path], outdir: Path) -> dict[str, Path]:
    model = load_model(inputs["model"], "the optimized model")
    stats_arrays, stats = tensorfile.load(inputs["stats"])
    sensitivity = json.loads(Path(inputs["sensitivity"]).read_text())
    evaluation = list(iterate_feeds(model, SampleFile(inputs["evaluation"]), params["samples"]))
    feeds, held_out = search_split(evaluation)
    probe = PrecisionProbe(model, stats["tensors"], stats_arrays, params["quantize"], feeds)
    work = op_work(model)
    levels = strategies.levels_of(params["candidates"])
    minimize = params.get("minimize", "cycles")
    # the code generator's own prices: every layer int8 and every layer int16 compiled once
    prices = Prices.compiled(
        model,
        stats["tensors"],
        stats_arrays,
        {"quantize": params["quantize"], "target": params["target"]},
        probe.layers,
        work,
        with_int16="int16" in levels,
    )
    costs = Costs(probe, probe.layers.units, levels, work, planned_price(probe, prices, work), minimize)
    units = strategies.search_order(sensitivity["layers"], costs)
    in_units = set(units)
    costs = replace(costs, units=units)  # searched in that order
    by_noise = sorted(sensitivity["layers"], key=lambda r: (r["quantized_alone"]["sqnr_db"], r["node"]))
    search = strategies.Search(
        Measurer(probe, params["goal"], golden_is_cheap(work, len(feeds))),
        costs,
        SearchLog(costs, params["goal"]),
        params["goal"],
        noise_units=[r["node"] for r in by_noise if r["node"] in in_units],
    )
    outcome = strategies.run(search)
    table, searched = outcome.table, outcome.metrics
    held = probe.confirm(table, held_out) if held_out else None
    judged = held or searched
    reached = outcome.reached and meets(judged, params["goal"])
    all_base = {u: levels[0] for u in units}
    summary = {
        "goal": params["goal"],
        "minimize": minimize,
        "candidates": levels,
        "reached": reached,
        # the figures the goal is judged on: the held-out images (the searched ones if none)
        "cosine": judged["cosine"],
        "sqnr_db": judged["sqnr_db"],
        "search_split": {
            "samples": len(feeds),
            "cosine": searched["cosine"],
            "sqnr_db": searched["sqnr_db"],
            "reached": outcome.reached,
        },
        "held_out": None
        if held is None
        else {"samples": len(held_out), "cosine": held["cosine"], "sqnr_db": held["sqnr_db"]},
        "int8_mac_share": costs.int8_mac_share(table),
        "runs_at": costs.effective(table),
        "cost": round(costs.cycles(table)),
        "cost_all_base": round(costs.cycles(all_base)),
        "precision": {u: table[u] for u in units},
        "macs": {u: work[u]["macs"] for u in units},
        "path": search.log.path,
        "search_order": units,
        "samples": len(feeds),
        "warnings": _warnings(params["goal"], outcome.reached, searched, held, len(feeds)),
    }
    if not outcome.reached and params["enforce"]:
        raise UserError(
            f"mixed precision goal {params['goal']} is not reachable with {levels}: "
            f"best found {metrics_text(searched)} after {len(search.log.path)} runs"
        )
    if not reached and params["enforce"]:
        raise UserError(f"mixed precision goal {params['goal']}: {summary['warnings'][0]}")
    table_path = write_json(
        outdir / "precision.json",
        {
            "version": 1,
            "layers": {u: p for u, p in sorted(table.items()) if p != "int8"},
        },
    )
    return {"table": table_path, "summary": write_json(outdir / "search.json", summary)}


def _warnings(goal: dict, reached: bool, searched: dict, held: dict | None, n_searched: int) -> list[str]:
    if not reached:
        return [f"goal {goal_text(goal)} not reached; best found: {metrics_text(searched)}"]
    if held is None:
        return [
            f"goal {goal_text(goal)} checked only on the {n_searched} evaluation image(s) it was "
            "searched on: add evaluation images so that half of them can be held out"
        ]
    if not meets(held, goal):
        return [
            f"goal {goal_text(goal)} met on the images searched on ({metrics_text(searched)}) but not on "
            f"the held-out ones ({metrics_text(held)}): more evaluation images or a stricter goal"
        ]
    return []
