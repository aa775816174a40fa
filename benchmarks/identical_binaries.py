"""Digests of every binary the example workspace and the test suite build, so that a refactoring
of the back end or the integer model can show it changed nothing.

    python benchmarks/identical_binaries.py --write benchmarks/binaries.sha256.json   # before
    python benchmarks/identical_binaries.py --check benchmarks/binaries.sha256.json   # after

Builds (up to quantize) the example's three real models and the test suite's small PP-OCR
classifier workspace, then compiles each integer model for both built-in targets twice, layer by
layer and grouped, and takes the sha256 of each `.npub` (and of each integer model, `.npq`, and its
QDQ export, which quantize writes). `--check` prints every difference and exits 1 on any.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _workspace_gen import EXAMPLE  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def digests(tmp: Path) -> dict[str, str]:
    sys.path.insert(0, str(REPO / "tests"))
    from conftest import CLS, make_small_ws
    from npubuild.cache.store import Store
    from npubuild.engine.run import build
    from npubuild.intmodel.interpreter import load_integer_model
    from npubuild.stages import fetch
    from npubuild.stages.onnx_utils import load_model
    from npubuild.targets.compile import compile_npub, plan_partition
    from npubuild.targets.spec import BUILTIN_TARGETS

    example = tmp / "example"
    shutil.copytree(EXAMPLE, example, ignore=shutil.ignore_patterns("npubuild-out"))
    small = make_small_ws(tmp / "small", fetch.run(CLS, {}, tmp)["model"])
    found: dict[str, str] = {}
    store = Store(tmp / "cache")
    try:
        for ws, labels in (
            (example, ["//models:yolo", "//models:ocr_det", "//models:ocr_cls"]),
            (small, ["//models:cls_npu"]),
        ):
            outcome = build(ws, store, labels, jobs=2, until="quantize")
            assert outcome.ok, outcome.errors
            for label in labels:
                out = ws / "npubuild-out" / "models" / label.rsplit(":", 1)[1]
                found[f"{label} quantized.npq"] = _sha((out / "quantized.npq").read_bytes())
                found[f"{label} quantized.qdq.onnx"] = _sha((out / "quantized.qdq.onnx").read_bytes())
                model = load_model(out / "optimized.onnx", "the optimized model")
                program, arrays, _ = load_integer_model(out / "quantized.npq")
                for target_name, target in sorted(BUILTIN_TARGETS.items()):
                    plan = plan_partition(program, arrays, model, target)
                    for group in (False, True):
                        binary, _, _ = compile_npub(program, arrays, model, target, plan, group=group)
                        mode = "grouped" if group else "layer-by-layer"
                        found[f"{label} {target_name} {mode} model.npub"] = _sha(binary)
    finally:
        store.close()
    return found


def main() -> int:
    parser = argparse.ArgumentParser()
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--write", type=Path)
    action.add_argument("--check", type=Path)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="npubuild-binaries-"))
    try:
        found = digests(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if args.write:
        args.write.write_text(json.dumps(found, indent=1, sort_keys=True) + "\n")
        print(f"wrote {len(found)} digests to {args.write}")
        return 0
    expected = json.loads(args.check.read_text())
    differ = sorted(k for k in expected.keys() | found.keys() if expected.get(k) != found.get(k))
    for key in differ:
        print(f"DIFFERS {key}: {expected.get(key, 'absent')[:12]} -> {found.get(key, 'absent')[:12]}")
    same = len(expected.keys() & found.keys()) - len([k for k in differ if k in expected and k in found])
    print(f"{same} of {len(expected)} artifacts byte-identical; {len(differ)} differ")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
