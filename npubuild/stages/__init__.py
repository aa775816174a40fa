"""The stage registry: name, code version and outputs of each stage, without importing its code.

A stage's module exposes `run(params, inputs, outdir) -> {output name: path}`. Its code version,
part of every action key, is the registry's version string plus a digest of every npubuild module
the stage's module can import and of the libraries it computes with (`codeversion`): editing any
code a stage runs invalidates exactly the results of the stages that run it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StageInfo:
    name: str
    version: str
    module: str
    outputs: dict[str, str]  # output name -> file name when materialised
    # run in a child process (engine/isolated.py): the stage hands a file from outside to native
    # code that may abort on it
    isolated: bool = False

    @property
    def code_version(self) -> str:
        from npubuild.stages.codeversion import versions

        return versions()[self.name]


STAGES: dict[str, StageInfo] = {
    s.name: s
    for s in (
        StageInfo("fetch", "1", "npubuild.stages.fetch", {"model": "model.onnx"}),
        StageInfo(
            "import",
            "1",
            "npubuild.stages.importer",
            {"model": "canonical.onnx", "summary": "import.json"},
            isolated=True,
        ),
        StageInfo("fuse", "1", "npubuild.stages.fuse", {"model": "fused.onnx"}),
        StageInfo(
            "optimize",
            "1",
            "npubuild.stages.optimize.stage",
            {"model": "optimized.onnx", "log": "optimize_log.json", "summary": "optimize.json"},
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
        ),
        StageInfo(
            "sensitivity",
            "1",
            "npubuild.stages.sensitivity",
            {"report": "sensitivity.json"},
        ),
        StageInfo(
            "search",
            "1",
            "npubuild.stages.search",
            {"table": "precision.json", "summary": "search.json"},
        ),
        StageInfo(
            "evaluate",
            "1",
            "npubuild.stages.evaluate",
            {"report": "accuracy.json"},
        ),
        StageInfo(
            "partition",
            "1",
            "npubuild.stages.partition",
            {"plan": "partition.json"},
        ),
        StageInfo(
            "codegen",
            "1",
            "npubuild.stages.codegen",
            {"binary": "model.npub", "listing": "model.lst", "summary": "codegen.json"},
        ),
        StageInfo(
            "simulate",
            "1",
            "npubuild.stages.simulate",
            {"report": "simulate.json"},
        ),
    )
}

# The stages of an npu_model in pipeline order; `--until` cuts the full list.
NPU_MODEL_PIPELINE = (
    "import",
    "fuse",
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
