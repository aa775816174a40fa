"""`npubuild report LABEL --html`: one self-contained HTML page (inline CSS and SVG, no scripts,
no fetches) with the pipeline and its cache status, per-layer accuracy, the sensitivity ranking
and search path, the NPU/CPU partition, the per-layer cycle breakdown and a roofline plot."""

from __future__ import annotations

import math
from html import escape

from npubuild.stages.wording import goal_text, layer_name, search_figures

CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px auto;max-width:1100px;color:#1d2330}
h1{font-size:22px;margin:0 0 4px} h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #dde2ea;padding-bottom:4px}
.muted{color:#66707f} .cards{display:flex;gap:12px;flex-wrap:wrap;margin:12px 0}
.card{background:#f5f7fa;border:1px solid #e1e6ee;border-radius:8px;padding:10px 14px;min-width:150px}
.card b{display:block;font-size:20px} table{border-collapse:collapse;margin:6px 0} td,th{padding:3px 10px;text-align:left;border-bottom:1px solid #eef1f5}
th{background:#f5f7fa} .ok{color:#1a7f37} .bad{color:#c62828} svg text{font:11px system-ui,sans-serif;fill:#333}
.legend span{display:inline-block;width:10px;height:10px;margin:0 4px 0 12px;border-radius:2px}
.scroll{overflow-x:auto;max-width:100%}
.pipeline{display:flex;flex-wrap:wrap;gap:8px;margin:6px 0} .step{color:#fff;border-radius:6px;padding:4px 12px;text-align:center;opacity:.9}
svg{max-width:100%;height:auto}
"""
STATUS_COLOURS = {"ran": "#2e7d32", "cached": "#1565c0", "failed": "#c62828", "corrupt": "#c62828"}
BITS_COLOURS = {8: "#5b8def", 16: "#f0a030"}


def _card(title: str, value: str) -> str:
    return f'<div class="card"><span class="muted">{escape(title)}</span><b>{escape(value)}</b></div>'


def _pipeline(steps: list[dict]) -> str:
    """The steps as boxes in a row that wraps (a long pipeline must not widen the page)."""
    boxes = "".join(
        f'<div class="step" style="background:{STATUS_COLOURS.get(s["status"], "#9e9e9e")}">'
        f"{escape(s['step'])}<br><small>{escape(s['status'])}</small></div>"
        for s in steps
    )
    legend = "".join(
        f'<span style="background:{c}"></span>{k}' for k, c in STATUS_COLOURS.items() if k != "corrupt"
    )
    return f'<div class="pipeline">{boxes}</div><div class="legend muted">{legend}</div>'


EXACT_DB = 60.0  # SQNR beyond which a layer counts as exact (int8 of a smooth signal: ~40-50 dB)


def _bars(
    rows: list[tuple[str, float, str]],
    unit: str,
    width: int = 1050,
    row_h: int = 14,
    cap: float | None = None,
) -> str:
    """Horizontal bars: (label, value, colour); a value above `cap` is drawn at full length (its
    label keeps the value), so one exact layer does not squeeze every other bar."""
    if not rows:
        return '<p class="muted">nothing to show</p>'
    top = max(max(v for _, v, _ in rows), 1e-9)
    top = min(top, cap) if cap else top
    label_w, height = 300, row_h * len(rows) + 6
    parts = []
    for k, (label, value, colour) in enumerate(rows):
        y = k * row_h + 2
        w = max(1.0, (width - label_w - 80) * min(max(value, 0), top) / top)
        parts.append(
            f'<text x="{label_w - 6}" y="{y + row_h - 4}" text-anchor="end">{escape(label[:48])}</text>'
            f'<rect x="{label_w}" y="{y}" width="{w:.1f}" height="{row_h - 3}" fill="{colour}"/>'
            f'<text x="{label_w + w + 4:.1f}" y="{y + row_h - 4}">{value:.3g} {unit}</text>'
        )
    return f'<svg width="{width}" height="{height}">{"".join(parts)}</svg>'


def _line(points: list[tuple[float, float, bool]], y_label: str, width: int = 700, height: int = 220) -> str:
    """A line chart of (x, y, goal met) with met points green."""
    if not points:
        return ""
    ys = [p[1] for p in points]
    lo, hi = min(ys), max(ys)
    hi = hi if hi > lo else lo + 1e-6
    n = max(len(points) - 1, 1)
    sx = lambda i: 50 + (width - 70) * i / n  # noqa: E731
    sy = lambda v: height - 30 - (height - 50) * (v - lo) / (hi - lo)  # noqa: E731
    path = " ".join(f"{'M' if i == 0 else 'L'}{sx(i):.1f},{sy(p[1]):.1f}" for i, p in enumerate(points))
    dots = "".join(
        f'<circle cx="{sx(i):.1f}" cy="{sy(p[1]):.1f}" r="3.5" fill="{"#2e7d32" if p[2] else "#c62828"}"/>'
        for i, p in enumerate(points)
    )
    axes = (
        f'<line x1="50" y1="{height - 30}" x2="{width - 20}" y2="{height - 30}" stroke="#999"/>'
        f'<line x1="50" y1="10" x2="50" y2="{height - 30}" stroke="#999"/>'
        f'<text x="46" y="{sy(hi) + 4:.1f}" text-anchor="end">{hi:.4g}</text>'
        f'<text x="46" y="{sy(lo) + 4:.1f}" text-anchor="end">{lo:.4g}</text>'
        f'<text x="{width / 2}" y="{height - 8}" text-anchor="middle">search step</text>'
        f'<text x="12" y="{height / 2}" transform="rotate(-90 12 {height / 2})" text-anchor="middle">{escape(y_label)}</text>'
    )
    return f'<svg width="{width}" height="{height}">{axes}<path d="{path}" fill="none" stroke="#5b8def"/>{dots}</svg>'


# a layer's dot by how its convolutions took the MAC array (docs/npu.md, "Mappings")
MAPPING_COLOURS = {"channels": "#5b8def", "depthwise": "#2e9d5b", "spatial": "#e39b22"}


def _roofline(layers: list[dict], target: dict, width: int = 700, height: int = 380) -> str:
    """Log-log: arithmetic intensity (MACs per DRAM byte) against attained MACs per cycle, each
    layer coloured by its mapping."""
    peak = target["mac_rows"] * target["mac_cols"]
    bw = target["dram_bytes_per_cycle"]
    pts = []
    for r in layers:
        span = r["end"] - r["start"]
        if r["macs"] and span > 0 and r["dram_bytes"] > 0:
            pts.append((r["macs"] / r["dram_bytes"], r["macs"] / span, r["node"], r.get("mapping", "")))
    if not pts:
        return '<p class="muted">no MAC layers</p>'
    x_lo = 10 ** math.floor(math.log10(min(p[0] for p in pts) / 2))
    x_hi = 10 ** math.ceil(math.log10(max(max(p[0] for p in pts) * 2, peak / bw * 4)))
    y_lo = 10 ** math.floor(math.log10(max(min(p[1] for p in pts) / 2, 1e-3)))
    y_hi = 10 ** math.ceil(math.log10(peak * 1.5))

    def sx(v: float) -> float:
        return 60 + (width - 80) * (math.log10(v) - math.log10(x_lo)) / (math.log10(x_hi) - math.log10(x_lo))

    def sy(v: float) -> float:
        return (
            height
            - 40
            - (height - 60) * (math.log10(v) - math.log10(y_lo)) / (math.log10(y_hi) - math.log10(y_lo))
        )

    knee = peak / bw
    roof = (
        f'<polyline points="{sx(x_lo):.1f},{sy(max(x_lo * bw, y_lo)):.1f} {sx(knee):.1f},{sy(peak):.1f} '
        f'{sx(x_hi):.1f},{sy(peak):.1f}" fill="none" stroke="#c62828" stroke-width="2"/>'
        f'<text x="{sx(x_hi) - 4:.1f}" y="{sy(peak) - 6:.1f}" text-anchor="end">peak {peak} MACs/cycle</text>'
        f'<text x="{sx(knee) - 8:.1f}" y="{sy(peak) + 16:.1f}" text-anchor="end">{bw:g} B/cycle</text>'
    )
    dots = "".join(
        f'<circle cx="{sx(x):.1f}" cy="{sy(max(y, y_lo)):.1f}" r="3" fill="{MAPPING_COLOURS.get(m, "#888")}" '
        f'opacity="0.75"><title>{escape(name)}: {x:.3g} MAC/B, {y:.3g} MAC/cycle'
        f"{', ' + escape(m) + ' mapping' if m else ''}</title></circle>"
        for x, y, name, m in pts
    )
    used = sorted({m for *_, m in pts if m})
    legend = "".join(
        f'<circle cx="{76 + 110 * k}" cy="32" r="4" fill="{MAPPING_COLOURS.get(m, "#888")}"/>'
        f'<text x="{84 + 110 * k}" y="36">{escape(m)}</text>'
        for k, m in enumerate(used)
    )
    ticks = ""
    for e in range(int(math.log10(x_lo)), int(math.log10(x_hi)) + 1):
        ticks += f'<text x="{sx(10**e):.1f}" y="{height - 24}" text-anchor="middle">1e{e}</text>'
    for e in range(int(math.log10(y_lo)), int(math.log10(y_hi)) + 1):
        ticks += f'<text x="54" y="{sy(10**e) + 4:.1f}" text-anchor="end">1e{e}</text>'
    axes = (
        f'<rect x="60" y="20" width="{width - 80}" height="{height - 60}" fill="none" stroke="#ccc"/>'
        f'<text x="{width / 2}" y="{height - 6}" text-anchor="middle">arithmetic intensity (MACs per DRAM byte)</text>'
        f'<text x="14" y="{height / 2}" transform="rotate(-90 14 {height / 2})" text-anchor="middle">MACs per cycle</text>'
    )
    return f'<svg width="{width}" height="{height}">{axes}{ticks}{roof}{dots}{legend}</svg>'


def _cycle_bars(layers: list[dict], width: int = 1050) -> str:
    rows = [r for r in layers if r["end"] > r["start"]]
    if not rows:
        return ""
    top = max(r["compute_cycles"] + r["dma_cycles"] for r in rows) or 1
    label_w, row_h = 300, 13
    parts = []
    for k, r in enumerate(rows):
        y = k * row_h + 2
        c = (width - label_w - 120) * r["compute_cycles"] / top
        d = (width - label_w - 120) * r["dma_cycles"] / top
        parts.append(
            f'<text x="{label_w - 6}" y="{y + 10}" text-anchor="end">{escape(r["node"][:46])}</text>'
            f'<rect x="{label_w}" y="{y}" width="{c:.1f}" height="10" fill="#5b8def"/>'
            f'<rect x="{label_w + c:.1f}" y="{y}" width="{d:.1f}" height="10" fill="#f0a030"/>'
            f'<text x="{label_w + c + d + 4:.1f}" y="{y + 10}">{r["end"] - r["start"]:,} cyc</text>'
        )
    legend = (
        '<div class="legend muted"><span style="background:#5b8def"></span>compute (MAC array / vector unit)'
    )
    legend += '<span style="background:#f0a030"></span>DMA (busy cycles; they overlap compute where tokens allow)</div>'
    return legend + f'<svg width="{width}" height="{row_h * len(rows) + 6}">{"".join(parts)}</svg>'


def render(label: str, steps: list[dict], data: dict[str, dict]) -> str:
    from npubuild.stages.metrics import clipped_layers, clipping_figures

    accuracy = data.get("evaluate")
    partition, codegen, simulate = data.get("partition"), data.get("codegen"), data.get("simulate")
    sensitivity, search = data.get("sensitivity"), data.get("search")
    body = [f"<h1>{escape(label)}</h1>"]
    cards = []
    if accuracy:
        for name, m in accuracy["outputs"].items():
            cards.append(_card(f"cosine ({name[:24]})", f"{m['cosine']:.5f}"))
            cards.append(_card("SQNR", f"{m['sqnr_db']:.1f} dB"))
    if codegen:
        cards.append(_card("estimated latency", f"{codegen['estimated_latency_ms']:.2f} ms"))
        cards.append(_card("MAC utilisation", f"{codegen['mac_utilisation']:.0%}"))
        if codegen.get("roofline_cycles"):
            cards.append(
                _card("vs roofline bound", f"{codegen['estimated_cycles'] / codegen['roofline_cycles']:.2f}x")
            )
            at_widths = codegen.get("roofline_cycles_at_widths", codegen["roofline_cycles"])
            if at_widths != codegen["roofline_cycles"]:  # 16-bit layers at the array's int16 rate
                cards.append(
                    _card("vs bound at layer widths", f"{codegen['estimated_cycles'] / at_widths:.2f}x")
                )
            cards.append(_card("DRAM traffic", f"{codegen['dram_bytes'] / 2**20:.1f} MiB"))
    if simulate:
        exact = simulate["bit_exact"]
        cards.append(_card("simulator vs integer model", "bit-exact" if exact["ok"] else "DIFFERS"))
    body.append(f'<div class="cards">{"".join(cards)}</div>')
    body.append("<h2>Pipeline</h2>" + _pipeline(steps))
    if accuracy:
        body.append("<h2>Accuracy of the integer model, per layer (SQNR against float)</h2>")
        body.append(
            '<div class="legend muted"><span style="background:#5b8def"></span>int8'
            '<span style="background:#f0a030"></span>int16</div>'
        )
        rows = [
            (f"{layer_name(r)} ({r['op_type']})", max(r["sqnr_db"], 0.0), BITS_COLOURS.get(r["bits"], "#999"))
            for r in accuracy["layers"]
        ]
        body.append(_bars(rows, "dB", cap=EXACT_DB))
        if accuracy.get("float_nodes"):
            items = "".join(
                f"<tr><td>{escape(f['node'])}</td><td>{escape(f['op_type'])}</td><td>{escape(f['reason'])}</td></tr>"
                for f in accuracy["float_nodes"]
            )
            body.append(
                f"<p>Float ops</p><table><tr><th>node</th><th>op</th><th>reason</th></tr>{items}</table>"
            )
        clipped = [(r, clipping_figures(r)) for r in clipped_layers(accuracy["layers"])]
        if clipped:
            items = "".join(
                f"<tr><td>{escape(layer_name(r))}"
                + (f" (after its {escape(r['read_through'])})" if r.get("read_through") else "")
                + f"</td><td>{against:.2f}</td><td>{alone:.2f}</td>"
                f"<td>{r['clipped_samples']} of {accuracy['samples']}</td></tr>"
                for r, (alone, against) in clipped
            )
            body.append(
                "<p>Layers whose error is mostly clipping (values beyond the grid's ends)</p><table><tr>"
                f"<th>layer</th><th>SQNR dB</th><th>clipping alone, dB</th><th>samples</th></tr>{items}</table>"
            )
        worst = [(o, w) for o, rows in accuracy.get("worst_samples", {}).items() for w in rows]
        if worst:
            items = "".join(
                f"<tr><td>{escape(o)}</td><td>{escape(w['source'])}</td><td>{w['error_share']:.1%}</td></tr>"
                for o, w in worst
            )
            body.append(
                "<p>Evaluation samples with most of each output's squared error</p><table><tr>"
                f"<th>output</th><th>sample</th><th>share</th></tr>{items}</table>"
            )
    if sensitivity:
        body.append(
            "<h2>Sensitivity ranking (score = (1 - cos quantized alone) + (cos float alone - cos all int8))</h2>"
        )
        by_node = {r["node"]: r for r in sensitivity["layers"]}
        top = [by_node[n] for n in sensitivity["ranking"][:25] if n in by_node]
        body.append(
            _bars([(f"{r['node']} ({r['op_type']})", max(r["score"], 0.0), "#8e6bd8") for r in top], "")
        )
    if search:
        verdict = "met" if search["reached"] else "NOT met"
        body.append(
            f"<h2>Precision search: goal {escape(goal_text(search['goal']))} {verdict}, "
            f"{search['int8_mac_share']:.1%} of MACs in int8</h2><p>{escape(search_figures(search))}</p>"
        )
        body.append(_line([(p["step"], p["cosine"], bool(p["goal_met"])) for p in search["path"]], "cosine"))
        chosen = {k: v for k, v in search["precision"].items() if v != "int8"}
        items = "".join(f"<tr><td>{escape(k)}</td><td>{escape(v)}</td></tr>" for k, v in chosen.items())
        body.append(f"<table><tr><th>layer</th><th>precision</th></tr>{items}</table>")
    if partition:
        body.append(
            f"<h2>Partition on {escape(partition['target'])}: {partition['npu_ops']} ops on the NPU, "
            f"{partition['cpu_ops']} on the CPU, {partition['transitions']} transitions</h2>"
        )
        items = "".join(
            f"<tr><td>{escape(f['node'])}</td><td>{escape(f['kind'])}</td><td>{escape(f['reason'])}</td></tr>"
            for f in partition["fallbacks"]
        )
        body.append(f"<table><tr><th>runs on the CPU</th><th>kind</th><th>why</th></tr>{items}</table>")
        strip = "".join(
            f'<rect x="{k * 6}" y="0" width="{max(6 * len(sg["ops"]) - 1, 1)}" height="16" '
            f'fill="{"#2e7d32" if sg["device"] == "npu" else "#9e9e9e"}"><title>{sg["device"]}: {len(sg["ops"])} ops</title></rect>'
            for k, sg in _offsets(partition["subgraphs"])
        )
        total = sum(len(sg["ops"]) for sg in partition["subgraphs"])
        body.append(
            f'<p class="muted">subgraphs in order (green NPU, grey CPU)</p><svg width="{6 * total}" height="18">{strip}</svg>'
        )
    if codegen and codegen.get("layers"):
        body.append("<h2>Cycles per layer</h2>" + _cycle_bars(codegen["layers"]))
        body.append("<h2>Roofline</h2>" + _roofline(codegen["layers"], data["target"]))
    if simulate:
        rows = "".join(
            f"<tr><td>{escape(name)}</td><td>{m['vs_qdq']['cosine']:.5f}</td><td>{m['vs_float']['cosine']:.5f}</td>"
            f"<td>{m['vs_float']['sqnr_db']:.1f} dB</td></tr>"
            for name, m in simulate["end_to_end"].items()
        )
        body.append(
            "<h2>The binary end to end (NPU parts simulated, CPU parts in onnxruntime)</h2>"
            f"<table><tr><th>output</th><th>cos vs QDQ</th><th>cos vs float</th><th>SQNR vs float</th></tr>{rows}</table>"
        )
    return (
        f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>npubuild report {escape(label)}</title>'
        f"<style>{CSS}</style></head><body>{''.join(body)}</body></html>\n"
    )


def _offsets(subgraphs: list[dict]):
    at = 0
    for sg in subgraphs:
        yield at, sg
        at += len(sg["ops"])


def render_dashboard(rows: list[dict[str, str]], links: dict[str, str | None]) -> str:
    """`report //... --html`: one row per npu_model (the build summary's columns), each label a
    link to that model's own page where it has one. Self-contained like the model pages."""
    columns = [c for c in rows[0] if c != "label"] if rows else []
    head = "".join(f"<th>{escape(c)}</th>" for c in ["npu_model", *columns])
    body = []
    for r in rows:
        link = links.get(r["label"])
        name = f'<a href="{escape(link)}">{escape(r["label"])}</a>' if link else escape(r["label"])
        cells = []
        for c in columns:
            bad = r[c].startswith(("FAIL", "DIFFERS", "never")) or r[c] == "FAILED"
            cells.append(f'<td class="{"bad" if bad else ""}">{escape(r[c])}</td>')
        body.append(f"<tr><td>{name}</td>{''.join(cells)}</tr>")
    table = f'<div class="scroll"><table><tr>{head}</tr>{"".join(body)}</table></div>'
    return (
        '<!doctype html><html><head><meta charset="utf-8"><title>npubuild: models</title>'
        f"<style>{CSS}</style></head><body><h1>npubuild: {len(rows)} npu_models</h1>{table}</body></html>\n"
    )
