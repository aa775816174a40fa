"""What the terminal shows after a build: per target and step, what ran and what it found."""

from __future__ import annotations

from typing import Any

from rich.markup import escape

from npubuild.cache.digest import sha256_json
from npubuild.cache.store import CorruptBlob, Store
from npubuild.engine.run import BuildOutcome
from npubuild.stages.wording import goal_text, layer_name, precision_kind, search_figures


def plural(n: int, noun: str) -> str:
    """'1 float op', '3 float ops'."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def summary_of(store: Store, outcome: BuildOutcome, action) -> dict[str, Any] | None:
    result = outcome.result(action)
    outputs = result.outputs if result.ok else {}
    digest = outputs.get("summary") or outputs.get("report") or outputs.get("plan")
    if digest is None:
        return None
    try:
        return store.read_json(digest)
    except (CorruptBlob, KeyError):
        return None


# Below this cosine to float on any output, a model without a min_cosine gate gets a warning: a
# detector or classifier that keeps its rankings sits well above it, a collapsed one far below.
LOW_COSINE = 0.98


def _verdicts(plan, summaries: dict[str, dict]) -> list[str]:
    """Warnings a user must not miss: a failed gate, or no gate and an output far from float."""
    from npubuild.gates import check

    found = []
    optimize = summaries.get("optimize")
    if optimize and not optimize["check"]["passed"]:
        found.append(
            f"{plan.label}: the optimized graph differs from the imported one beyond tolerance "
            f"(max|diff| {optimize['check']['max_abs_diff']:.2g}); see 'npubuild report {plan.label}'"
        )
    evaluate = summaries.get("evaluate")
    if evaluate is None:
        return found
    found += [
        f"{plan.label} fails its gate {r.describe()}; 'npubuild test' exits 3"
        for r in check(str(plan.label), plan.gates, summaries)
        if not r.ok
    ]
    if "min_cosine" not in plan.gates:
        found += [
            f"{plan.label} output '{name}': cosine {m['cosine']:.4f} to the float model is below "
            f"{LOW_COSINE}; the integer model does not compute what the float one does on these "
            f"evaluation images (see 'npubuild report {plan.label}', or declare gates)"
            for name, m in evaluate["outputs"].items()
            if m.get("cosine", 1.0) < LOW_COSINE
        ]
    return found


def render_build(console, store: Store, outcome: BuildOutcome) -> None:
    """Print the build summary. The text is a function of each step's status and summary digest
    (and the terminal), so a rebuild that changes neither prints the text kept from last time: a
    no-op build would otherwise spend most of its time reading a few hundred summaries."""
    key = _rendering_key(console, outcome)
    kept = store.get_meta("rendered_build") or {}
    if kept.get("key") == key:
        try:
            console.file.write(store.read_bytes(kept["digest"]).decode())
            console.file.flush()
            return
        except (CorruptBlob, KeyError, UnicodeDecodeError):
            pass  # evicted or damaged: render it again
    with console.capture() as capture:
        _render_build(console, store, outcome)
    text = capture.get()
    console.file.write(text)
    console.file.flush()
    store.set_meta("rendered_build", {"key": key, "digest": store.put_bytes(text.encode())})


def _rendering_key(console, outcome: BuildOutcome) -> str:
    steps = []
    for plan in outcome.plans:
        for step, action in plan.steps:
            result = outcome.result(action)
            steps.append([str(plan.label), step, result.status, result.outputs if result.ok else None])
        steps.append([plan.notes, plan.gates])
    from npubuild.stages.codeversion import current_stamp

    terminal = [console.width, console.color_system, console.is_terminal]
    return sha256_json([current_stamp(), terminal, steps])  # this code's rendering of these steps


def _render_build(console, store: Store, outcome: BuildOutcome) -> None:
    """One line per requested target: which steps ran, how many came from the cache, and the
    figures of overview.py; then the warnings. The details are in `npubuild report LABEL`."""

    from npubuild.overview import COLUMNS, model_figures, other_figures, print_rows

    rows: list[list[str]] = []
    warnings: list[str] = [note for plan in outcome.plans for note in plan.notes]
    for plan in outcome.plans:
        ran, cached, failed = [], [], []
        summaries: dict[str, dict] = {}
        for step, action in plan.steps:
            result = outcome.result(action)
            {"ran": ran, "cached": cached}.get(result.status, failed).append(step)
            summary = summary_of(store, outcome, action)
            if summary is not None:
                summaries[step.replace(" dataset", "")] = summary
                warnings += [f"{plan.label} {step}: {w}" for w in summary.get("warnings", [])]
        warnings += _verdicts(plan, summaries)
        if plan.kind == "npu_model":
            figures = list(model_figures(summaries, plan.gates).values())
        else:
            figures = [other_figures(plan.kind, summaries)] + [""] * (len(COLUMNS) - 1)
        if failed:
            figures[0] = f"[red]not built: {escape(', '.join(failed))}[/]"
        shown = f"all {len(ran)} steps" if len(ran) > 4 and not cached and not failed else " ".join(ran)
        rows.append(
            [
                escape(str(plan.label)),
                f"[green]{escape(shown)}[/]" if ran else "-",
                f"[cyan]{len(cached)}[/]" if cached else "-",
                *(f if f.startswith("[red]") else escape(f) for f in figures),
            ]
        )
    print_rows(console, ["target", "ran", "cached", *COLUMNS], rows, title="npubuild")
    for w in dict.fromkeys(warnings):
        console.print(f"[yellow]warning:[/] {escape(w)}", highlight=False, soft_wrap=True)


def render_details(console, label: str, summaries: dict[str, dict]) -> None:
    """`npubuild report LABEL`'s lines about the build beyond accuracy: the float model's check,
    the data, what runs where, the binary and the simulator (what the build summary leaves out)."""
    optimize = summaries.get("optimize")
    if optimize:
        c = optimize["check"]
        tol = min(o["tolerance"] for o in c["outputs"].values())
        console.print(
            f"{escape(label)}: optimized graph {optimize['nodes_before']} -> "
            f"{optimize['nodes_after']} nodes, "
            f"check {'ok' if c['passed'] else 'FAILED'} max|diff| {c['max_abs_diff']:.2g} "
            f"(tol {tol:.2g}, {c['samples']} samples)",
            highlight=False,
        )
    part, gen = summaries.get("partition"), summaries.get("codegen")
    if part and gen:
        for line in _back_end(label, part, gen, summaries.get("simulate")):
            console.print(line, highlight=False)


def _back_end(label, part: dict, gen: dict, sim: dict | None) -> list[str]:
    """What runs where and why, the binary's size and the simulator's check."""
    npu_ms = gen.get("npu_latency_ms", gen["estimated_latency_ms"])
    lines = [
        f"{label} on {part['target']}: {part['npu_ops']} ops on the NPU, {part['cpu_ops']} on the CPU "
        f"({part['transitions']} NPU/CPU transitions), {gen['instructions']:,} instructions, "
        f"binary {gen['binary_bytes'] / 1024:,.0f} KiB; "
        f"estimated latency {gen['estimated_latency_ms']:.2f} ms: NPU {npu_ms:.2f} ms "
        f"({gen['estimated_cycles']:,} cycles, MAC utilisation {gen['mac_utilisation']:.0%}), "
        f"CPU {gen.get('cpu_latency_ms', 0.0):.2f} ms, hand-overs {gen.get('transition_ms', 0.0):.2f} ms"
    ]
    if gen.get("roofline_cycles"):
        bound_ms = gen["roofline_cycles"] / gen["estimated_cycles"] * npu_ms
        at_widths = gen.get("roofline_cycles_at_widths", gen["roofline_cycles"])
        widths = (  # a table with 16-bit layers: the bound with those at the array's int16 rate
            f", {gen['estimated_cycles'] / at_widths:.1f}x the bound at the layers' widths"
            if at_widths != gen["roofline_cycles"]
            else ""
        )
        lines.append(
            f"  roofline bound {bound_ms:.2f} ms "
            f"(estimate {gen['estimated_cycles'] / gen['roofline_cycles']:.1f}x "
            f"the bound{widths}); DRAM traffic {gen['dram_bytes'] / 2**20:.1f} MiB, "
            f"{gen['dram_bytes'] / max(gen['compulsory_dram_bytes'], 1):.1f}x the compulsory "
            f"{gen['compulsory_dram_bytes'] / 2**20:.1f} MiB"
        )
    reasons: dict[str, int] = {}
    for f in part["fallbacks"]:
        reasons[f["reason"]] = reasons.get(f["reason"], 0) + 1
    for reason, n in reasons.items():
        lines.append(f"  CPU: {n} x {escape(reason)}")
    if sim:
        c, exact = sim["counters"], sim["bit_exact"]
        moved = c.get("dma_in_bytes", 0) + c.get("dma_out_bytes", 0)
        verdict = "[green]bit-exact[/]" if exact["ok"] else "[red]DIFFERS[/]"
        lines.append(
            f"  simulator: {verdict} with the integer model ({exact['exact']:,} of {exact['elements']:,} "
            f"elements, {sim['samples']} samples); SRAM peak {c.get('sram_peak_bytes', 0) / 1024:,.0f} KiB, "
            f"DRAM moved {moved / 2**20:,.1f} MiB, {c.get('macs', 0) / 1e9:.2f} GMAC per inference"
        )
        for name, m in sim["end_to_end"].items():
            lines.append(
                f"  end to end {escape(name)}: vs QDQ cos {m['vs_qdq']['cosine']:.5f}, "
                f"vs float cos {m['vs_float']['cosine']:.5f} SQNR {m['vs_float']['sqnr_db']:.1f} dB"
            )
    return lines


def counts(outcome: BuildOutcome) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in outcome.results.values():
        out[r.status] = out.get(r.status, 0) + 1
    return out


def render_search(console, sensitivity: dict | None, search: dict | None) -> None:
    """`npubuild report`: the sensitivity ranking, the search path and the chosen precisions."""
    from rich.table import Table

    if sensitivity:
        table = Table(
            title="sensitivity (most sensitive first)",
            title_justify="left",
            box=None,
            pad_edge=False,
            header_style="bold",
        )
        for col in ("layer", "op", "MACs", "int8 alone: cos", "float alone: cos", "score"):
            table.add_column(col, justify="left" if col in ("layer", "op") else "right")
        rows = {r["node"]: r for r in sensitivity["layers"]}
        for name in sensitivity["ranking"][:15]:
            r = rows[name]
            table.add_row(
                escape(name),
                r["op_type"],
                f"{r['macs']:,}",
                f"{r['quantized_alone']['cosine']:.5f}",
                f"{r['float_alone']['cosine']:.5f}" if r["float_alone"] else "-",  # not measured
                f"{r['score']:.2e}",
            )
        console.print(table)
    if search:
        table = Table(
            title=f"precision search, goal {goal_text(search['goal'])}",
            title_justify="left",
            box=None,
            pad_edge=False,
            header_style="bold",
        )
        for col in ("step", "action", "cosine", "SQNR dB", "cost", "int8 MACs", "goal"):
            table.add_column(col, justify="left" if col == "action" else "right")
        for p in search["path"]:
            table.add_row(
                str(p["step"]),
                escape(p["action"]),
                f"{p['cosine']:.5f}",
                f"{p['sqnr_db']:.2f}",
                f"{p['cost']:,}",
                f"{p['int8_mac_share']:.1%}",
                "met" if p["goal_met"] else "-",
            )
        console.print(table)
        chosen = {k: v for k, v in search["precision"].items() if v != "int8"}
        verdict = "met" if search["reached"] else "NOT met (best result shown)"
        console.print(
            f"  goal {verdict}: {search_figures(search)}; "
            f"{search['int8_mac_share']:.1%} of MACs in int8, estimated cost {search['cost']:,} cycles "
            f"(all int8: {search['cost_all_base']:,})",
            highlight=False,
        )
        for name, precision in chosen.items():
            console.print(f"  {escape(name)}: {precision}", highlight=False)


def render_accuracy(console, label: str, report: dict) -> None:
    """`npubuild report`: outputs, every layer, what stayed float, and the golden-vs-QDQ check."""
    from rich.table import Table

    from npubuild.stages.metrics import clipped_layers, clipping_figures

    console.print(
        f"[bold]{escape(label)}[/]: {precision_kind(report)} model against float on {report['samples']} "
        "evaluation samples"
    )
    for name, m in report["outputs"].items():
        console.print(
            f"  output {escape(name)}: cosine {m['cosine']:.5f}, SQNR {m['sqnr_db']:.2f} dB, "
            f"max abs error {m['max_abs_error']:.4g}",
            highlight=False,
        )
        worst = report.get("worst_samples", {}).get(name, [])
        if worst:
            shares = ", ".join(f"{escape(w['source'])} {w['error_share']:.0%}" for w in worst)
            console.print(f"    most of its error: {shares}", highlight=False)
    table = Table(box=None, pad_edge=False, header_style="bold")
    for col in ("layer", "op", "bits", "cosine", "SQNR dB"):
        table.add_column(col, justify="right" if col in ("bits", "cosine", "SQNR dB") else "left")
    worst = set(report["worst_layers"])
    for row in report["layers"]:
        style = "[red]" if row["tensor"] in worst else ""
        end = "[/]" if style else ""
        table.add_row(
            f"{style}{escape(layer_name(row))}{end}",
            row["op_type"],
            str(row["bits"]),
            f"{row['cosine']:.5f}",
            f"{row['sqnr_db']:.2f}",
        )
    console.print(table)
    for row in clipped_layers(report["layers"]):
        alone, against = clipping_figures(row)
        after = f" after its {row['read_through']}" if row.get("read_through") else ""
        console.print(
            f"  clipped: {escape(layer_name(row))} at {against:.2f} dB{after}; clipping alone would leave "
            f"{alone:.2f} dB (values beyond its grid in {row['clipped_samples']} of "
            f"{report['samples']} samples)",
            highlight=False,
        )
    for f in report["float_nodes"]:
        console.print(
            f"  float: {escape(f['node'])} ({f['op_type']}): {escape(f['reason'])}", highlight=False
        )
    for name, m in report["golden_vs_qdq"].get("outputs", {}).items():
        if "cosine" in m:
            console.print(
                f"  QDQ export vs integer model, output {escape(name)}: cosine {m['cosine']:.5f}",
                highlight=False,
            )
    g = report["golden_vs_qdq"]["op_by_op"]
    if g["elements"]:
        console.print(
            f"  golden interpreter vs QDQ model in onnxruntime, op by op: {g['within_1_lsb']:.6%} of "
            f"{g['elements']:,} elements within 1 LSB ({g['exact']:.4%} exact)",
            highlight=False,
        )
