"""`npubuild test`: each npu_model's gates checked against its last build, and JUnit XML for CI.

Accuracy gates read the integer model's evaluation (accuracy.json: the worst output's cosine,
SQNR and top-1 agreement); the latency gate reads the code generator's estimate (codegen.json).
"""

from __future__ import annotations

from dataclasses import dataclass
from xml.sax.saxutils import escape, quoteattr

GATE_SOURCES = {
    "min_cosine": ("evaluate", "cosine"),
    "min_sqnr": ("evaluate", "sqnr_db"),
    "min_top1": ("evaluate", "top1_agreement"),
    "max_latency_ms": ("codegen", "estimated_latency_ms"),
}


@dataclass
class GateResult:
    target: str
    gate: str
    limit: float
    value: float | None
    ok: bool

    def describe(self) -> str:
        shown = "missing" if self.value is None else f"{self.value:.6g}"
        relation = "<=" if self.gate.startswith("max_") else ">="
        return f"{self.gate}: {shown} (needs {relation} {self.limit:g})"


def measured(gate: str, summaries: dict[str, dict]) -> float | None:
    stage, key = GATE_SOURCES[gate]
    summary = summaries.get(stage)
    if summary is None:
        return None
    if stage == "evaluate":
        values = [m[key] for m in summary["outputs"].values() if key in m]
        return min(values) if values else None
    return summary.get(key)


def check(target: str, gates: dict, summaries: dict[str, dict]) -> list[GateResult]:
    results = []
    for gate, limit in gates.items():
        if limit is None:
            continue
        value = measured(gate, summaries)
        if value is None:
            ok = False
        elif gate.startswith("max_"):
            ok = value <= limit
        else:
            ok = value >= limit
        results.append(GateResult(target, gate, float(limit), value, ok))
    return results


def junit(results: dict[str, list[GateResult]], build_errors: dict[str, str], seconds: float) -> str:
    """One <testcase> per npu_model: failed gates as <failure>, a build error as <error>."""
    cases = []
    failures = errors = 0
    for target in sorted(set(results) | set(build_errors)):
        name = quoteattr(target)
        if target in build_errors:
            errors += 1
            message = quoteattr(build_errors[target])
            error = f"<error message={message}/>"
            cases.append(f'  <testcase classname="npubuild" name={name}>{error}</testcase>')
            continue
        failed = [r for r in results[target] if not r.ok]
        body = "".join(
            f"\n    <failure message={quoteattr(r.describe())}>{escape(r.describe())}</failure>"
            for r in failed
        )
        passed = "; ".join(r.describe() for r in results[target] if r.ok)
        out = f"\n    <system-out>{escape(passed)}</system-out>" if passed else ""
        failures += bool(failed)
        cases.append(f'  <testcase classname="npubuild" name={name}>{body}{out}\n  </testcase>')
    head = (
        f'<?xml version="1.0" encoding="utf-8"?>\n<testsuite name="npubuild" tests="{len(cases)}" '
        f'failures="{failures}" errors="{errors}" time="{seconds:.3f}">\n'
    )
    return head + "\n".join(cases) + "\n</testsuite>\n"
