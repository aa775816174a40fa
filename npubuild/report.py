"""What the terminal shows after a build: per target and step, what ran and what it found."""

from __future__ import annotations

from typing import Any

from rich.markup import escape

from npubuild.cache.store import CorruptBlob, Store
from npubuild.engine.run import BuildOutcome

_STATUS_STYLE = {"ran": "bold green", "cached": "cyan", "failed": "bold red", "skipped": "yellow"}


def _summary(store: Store, outcome: BuildOutcome, action) -> dict[str, Any] | None:
    result = outcome.result(action)
    digest = result.outputs.get("summary") if result.ok else None
    if digest is None:
        return None
    try:
        return store.read_json(digest)
    except (CorruptBlob, KeyError):
        return None


def step_details(stage: str, s: dict[str, Any] | None) -> str:
    if s is None:
        return ""
    if stage == "import":
        shapes = ", ".join(f"{i['name']} {i['shape']}" for i in s["inputs"])
        opset = f"opset {s['opset_before']}->{s['opset']}"
        return f"{s['nodes']} nodes, {opset}, {s['parameters']:,} params; {shapes}"
    if stage == "optimize":
        c = s["check"]
        verdict = "ok" if c["passed"] else "FAILED"
        tol = min(o["tolerance"] for o in c["outputs"].values())
        return (
            f"nodes {s['nodes_before']} -> {s['nodes_after']} in {s['iterations']} iterations; "
            f"check {verdict}: max|diff| {c['max_abs_diff']:.3g} (tol {tol:.3g}) on {c['samples']} samples"
        )
    if stage == "prepare":
        value_range = f"[{s['min']:.3g}, {s['max']:.3g}]"
        return f"{s['count']} samples of {s['sample_shape']} {s['dtype']}, range {value_range}"
    if stage == "fetch":
        return ""
    return ""


def render_build(console, store: Store, outcome: BuildOutcome) -> None:
    from rich.table import Table

    table = Table(title="npubuild", title_justify="left", show_lines=False, pad_edge=False)
    for col in ("target", "step", "status", "time", "details"):
        table.add_column(col, no_wrap=col != "details")
    warnings: list[str] = []
    for plan in outcome.plans:
        first = True
        for step, action in plan.steps:
            result = outcome.result(action)
            summary = _summary(store, outcome, action)
            if summary:
                warnings += [f"{plan.label} {step}: {w}" for w in summary.get("warnings", [])]
            style = _STATUS_STYLE.get(result.status, "")
            seconds = f"{result.seconds:.1f}s" if result.status == "ran" else ""
            details = escape(step_details(action.stage, summary) if result.ok else result.message)
            table.add_row(
                str(plan.label) if first else "", step, f"[{style}]{result.status}[/]", seconds, details
            )
            first = False
        if not plan.steps:
            table.add_row(str(plan.label), "-", "[cyan]ok[/]", "", f"{plan.target.kind} (no build steps)")
    console.print(table)
    for w in dict.fromkeys(warnings):
        console.print(f"[yellow]warning:[/] {escape(w)}", highlight=False)


def counts(outcome: BuildOutcome) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in outcome.results.values():
        out[r.status] = out.get(r.status, 0) + 1
    return out
