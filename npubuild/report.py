"""What the terminal shows after a build: per target and step, what ran and what it found."""

from __future__ import annotations

from typing import Any

from rich.markup import escape

from npubuild.cache.store import CorruptBlob, Store
from npubuild.engine.run import BuildOutcome


def _summary(store: Store, outcome: BuildOutcome, action) -> dict[str, Any] | None:
    result = outcome.result(action)
    digest = result.outputs.get("summary") if result.ok else None
    if digest is None:
        return None
    try:
        return store.read_json(digest)
    except (CorruptBlob, KeyError):
        return None


def _details(plan, summaries: dict[str, dict]) -> list[str]:
    """The facts a user scans for: node counts, the numeric check, data-set sizes."""
    parts = []
    if "optimize" in summaries:
        s = summaries["optimize"]
        c = s["check"]
        tol = min(o["tolerance"] for o in c["outputs"].values())
        verdict = "ok" if c["passed"] else "FAILED"
        parts.append(f"nodes {s['nodes_before']} -> {s['nodes_after']}")
        parts.append(
            f"check {verdict} max|diff| {c['max_abs_diff']:.2g} (tol {tol:.2g}, {c['samples']} samples)"
        )
    elif "import" in summaries:
        s = summaries["import"]
        parts.append(
            f"{s['nodes']} nodes, opset {s['opset_before']}->{s['opset']}, {s['parameters']:,} params"
        )
    for step, s in summaries.items():
        if step.startswith("prepare"):
            role = step.split(" ", 1)[1] if " " in step else "data"
            parts.append(f"{role} {s['count']}x{s['sample_shape']}")
    return parts


def render_build(console, store: Store, outcome: BuildOutcome) -> None:
    """One row per requested target: which steps ran, which came from the cache, what they found."""
    from rich.table import Table

    table = Table(title="npubuild", title_justify="left", pad_edge=False, box=None, header_style="bold")
    for col in ("target", "ran", "cached", "details"):
        table.add_column(col, no_wrap=col != "details")
    warnings: list[str] = []
    for plan in outcome.plans:
        ran, cached, failed = [], [], []
        summaries: dict[str, dict] = {}
        for step, action in plan.steps:
            result = outcome.result(action)
            {"ran": ran, "cached": cached}.get(result.status, failed).append(step)
            summary = _summary(store, outcome, action)
            if summary is not None:
                summaries[step.replace(" dataset", "")] = summary
                warnings += [f"{plan.label} {step}: {w}" for w in summary.get("warnings", [])]
        details = ", ".join(_details(plan, summaries)) or plan.kind
        if failed:
            details = f"[red]not built: {escape(', '.join(failed))}[/]; " + escape(details)
        else:
            details = escape(details)
        table.add_row(
            str(plan.label),
            f"[green]{escape(' '.join(ran))}[/]" if ran else "-",
            f"[cyan]{len(cached)}[/]" if cached else "-",
            details,
        )
    console.print(table)
    for w in dict.fromkeys(warnings):
        console.print(f"[yellow]warning:[/] {escape(w)}", highlight=False)


def counts(outcome: BuildOutcome) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in outcome.results.values():
        out[r.status] = out.get(r.status, 0) + 1
    return out
