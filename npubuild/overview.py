"""One line per target: the figures a user scans a monorepo for. The build summary and
`npubuild report //...` print the same columns, from the stages' summaries (a build's, or the last
build's kept in the cache); the details are in `npubuild report LABEL`."""

from __future__ import annotations

from typing import Any

from npubuild.gates import check
from npubuild.stages.wording import layer_widths, precision_kind

COLUMNS = ("accuracy", "QDQ export", "int8 MACs", "NPU ops", "latency", "simulator", "gates")


def _accuracy(evaluate: dict) -> str:
    """The worst output's cosine and SQNR (and top-1 where the output has classes)."""
    kind = precision_kind(evaluate)
    outputs = evaluate["outputs"]
    if not outputs:
        return kind
    name, worst = min(outputs.items(), key=lambda kv: kv[1].get("cosine", 1.0))
    text = f"{kind} cos {worst['cosine']:.4f} SQNR {worst['sqnr_db']:.1f} dB"
    if "top1_agreement" in worst:
        text += f" top-1 {worst['top1_agreement']:.3f}"
    return text + (f" ({name}, worst of {len(outputs)})" if len(outputs) > 1 else "")


def _int8_macs(summaries: dict[str, dict]) -> str:
    if "search" in summaries:
        return f"{summaries['search']['int8_mac_share']:.1%}"
    evaluate = summaries.get("evaluate")
    if evaluate and layer_widths(evaluate) <= {8}:
        return "100%"  # no precision search and every layer int8 (float ops hold no MACs of the NPU)
    return "-"


def model_figures(summaries: dict[str, dict], gates: dict[str, float]) -> dict[str, str]:
    """The COLUMNS of one npu_model; '-' where its build did not get that far."""
    figures = dict.fromkeys(COLUMNS, "-")
    if "evaluate" in summaries:
        figures["accuracy"] = _accuracy(summaries["evaluate"])
        if "search" in summaries:  # a precision goal: met or not is the first thing to know
            verdict = "goal met" if summaries["search"]["reached"] else "goal NOT met"
            figures["accuracy"] = f"{verdict}, {figures['accuracy']}"
        figures["int8 MACs"] = _int8_macs(summaries)
        export = summaries["evaluate"].get("golden_vs_qdq", {}).get("outputs", {})
        agreement = [m["cosine"] for m in export.values() if "cosine" in m]
        if agreement:  # the export against the integer model, worst output: what a deployer gets
            figures["QDQ export"] = f"cos {min(agreement):.4f}"
    part, gen, sim = summaries.get("partition"), summaries.get("codegen"), summaries.get("simulate")
    if part:
        figures["NPU ops"] = f"{part['npu_ops']}/{part['npu_ops'] + part['cpu_ops']}"
    if gen:
        target = part["target"] if part else ""
        figures["latency"] = f"{gen['estimated_latency_ms']:.2f} ms {target}".rstrip()
    if sim:
        figures["simulator"] = "bit-exact" if sim["bit_exact"]["ok"] else "DIFFERS"
    if gates and "evaluate" not in summaries:
        figures["gates"] = f"{len(gates)} not checked"  # no build to check them against
    elif gates:
        results = check("", gates, summaries)
        failed = [r.gate for r in results if not r.ok]
        figures["gates"] = f"FAIL {', '.join(failed)}" if failed else f"{len(results)} pass"
    else:
        figures["gates"] = "none"
    return figures


def other_figures(kind: str, summaries: dict[str, dict[str, Any]]) -> str:
    """What a data set or an onnx_model target shows instead: samples, or nodes and parameters."""
    if "import" in summaries:
        s = summaries["import"]
        return f"{s['nodes']} nodes, opset {s['opset']}, {s['parameters']:,} params"
    for step, s in summaries.items():
        if step.startswith("prepare"):
            if "inputs" in s:  # named feeds of a model with several inputs
                return f"{s['count']} feeds of {', '.join(s['inputs'])}"
            return f"{s['count']} x {s['sample_shape']}"
    return kind


def print_rows(console, headers: list[str], rows: list[list[str]], title: str | None = None) -> None:
    """A table, each column as wide as its widest cell except 'accuracy' (the one that may be cut
    short: a label or a verdict cut short would mislead); on a terminal too narrow for that, one
    plain line per row with every cell, wrapped by the terminal rather than cut."""
    from rich.table import Table
    from rich.text import Text

    widths = [max([len(h)] + [Text.from_markup(r[k]).cell_len for r in rows]) for k, h in enumerate(headers)]
    others = sum(w for h, w in zip(headers, widths) if h != "accuracy") + 2 * (len(headers) - 1)
    if others + 12 > console.width:
        if title:
            console.print(f"[bold]{title}[/]")
        for row in rows:
            cells = [c for c in row if Text.from_markup(c).plain not in ("", "-")]
            console.print("  ".join(cells), highlight=False, soft_wrap=True)
        return
    table = Table(title=title, title_justify="left", pad_edge=False, box=None, header_style="bold")
    for header, widest in zip(headers, widths):
        if header == "accuracy":  # what the other columns leave (rich would crop the row instead)
            room = console.width - others
            table.add_column(header, no_wrap=True, overflow="ellipsis", width=min(widest, room))
        else:
            table.add_column(header, no_wrap=True, min_width=widest)
    for row in rows:
        table.add_row(*row)
    console.print(table)
