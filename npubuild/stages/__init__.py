"""The stage registry: name, code version and outputs of each stage, without importing its code.

A stage's module exposes `run(params, inputs, outdir) -> {output name: path}`. Its code version,
part of every action key, is the registry's version string plus a digest of the source files the
stage declares it depends on: editing a stage's code invalidates exactly that stage's results.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import cache
from pathlib import Path

_HERE = Path(__file__).parent


@dataclass(frozen=True)
class StageInfo:
    name: str
    version: str
    module: str
    outputs: dict[str, str]  # output name -> file name when materialised
    sources: tuple[str, ...] = ()  # files or folders under npubuild/stages/ its results depend on

    @property
    def code_version(self) -> str:
        return _code_version(self.name)


@cache
def _code_version(name: str) -> str:
    info = STAGES[name]
    h = hashlib.sha256(info.version.encode())
    for rel in ("onnx_utils.py", *info.sources):
        path = _HERE / rel
        files = sorted(path.rglob("*.py")) if path.is_dir() else [path]
        for f in files:
            h.update(str(f.resolve().relative_to(_HERE.parent)).encode() + b"\0" + f.read_bytes())
    return f"{info.version}-{h.hexdigest()[:16]}"


STAGES: dict[str, StageInfo] = {
    s.name: s
    for s in (
        StageInfo("fetch", "1", "npubuild.stages.fetch", {"model": "model.onnx"}, ("fetch.py",)),
        StageInfo(
            "import", "1", "npubuild.stages.importer", {"model": "canonical.onnx", "summary": "import.json"}
        ),
        StageInfo(
            "optimize",
            "1",
            "npubuild.stages.optimize.stage",
            {"model": "optimized.onnx", "log": "optimize_log.json", "summary": "optimize.json"},
            ("optimize",),
        ),
        StageInfo(
            "prepare", "1", "npubuild.stages.prepare", {"tensors": "tensors.npy", "summary": "manifest.json"}
        ),
        StageInfo(
            "calibrate",
            "1",
            "npubuild.stages.calibrate",
            {"stats": "stats.npbt", "summary": "calibrate.json"},
        ),
        StageInfo(
            "quantize",
            "1",
            "npubuild.stages.quantize.stage",
            {"integer": "quantized.npq", "qdq": "quantized.qdq.onnx", "summary": "quantize.json"},
            ("quantize", "tensorfile.py"),
        ),
        StageInfo(
            "sensitivity",
            "1",
            "npubuild.stages.sensitivity",
            {"report": "sensitivity.json"},
            ("sensitivity.py", "quantize", "optimize/check.py", "tensorfile.py"),
        ),
        StageInfo(
            "search",
            "1",
            "npubuild.stages.search",
            {"table": "precision.json", "summary": "search.json"},
            ("search.py", "quantize", "optimize/check.py", "tensorfile.py"),
        ),
        StageInfo(
            "evaluate",
            "1",
            "npubuild.stages.evaluate",
            {"report": "accuracy.json"},
            ("evaluate.py", "quantize", "optimize/check.py", "tensorfile.py"),
        ),
        StageInfo(
            "partition",
            "1",
            "npubuild.stages.partition",
            {"plan": "partition.json"},
            ("partition.py", "../targets", "quantize", "tensorfile.py"),
        ),
        StageInfo(
            "codegen",
            "1",
            "npubuild.stages.codegen",
            {"binary": "model.npub", "listing": "model.lst", "summary": "codegen.json"},
            ("codegen.py", "../targets", "quantize", "tensorfile.py"),
        ),
        StageInfo(
            "simulate",
            "1",
            "npubuild.stages.simulate",
            {"report": "simulate.json"},
            ("simulate.py", "../targets", "quantize", "evaluate.py", "optimize/check.py", "tensorfile.py"),
        ),
    )
}

# The stages of an npu_model in pipeline order; `--until` cuts the full list.
NPU_MODEL_PIPELINE = (
    "import",
    "optimize",
    "calibrate",
    "sensitivity",
    "search",
    "quantize",
    "evaluate",
    "partition",
    "codegen",
    "simulate",
)
ALL_PIPELINE_STAGES = NPU_MODEL_PIPELINE
