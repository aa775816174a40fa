"""The stage registry: name, code version and outputs of each stage, without importing its code.

A stage's module exposes `run(params, inputs, outdir) -> {output name: path}`. Its code version is
part of every action key: bump it whenever the stage would write different bytes for the same
inputs, so that old cache entries are not reused.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StageInfo:
    name: str
    version: str
    module: str
    outputs: dict[str, str]  # output name -> file name when materialised


STAGES: dict[str, StageInfo] = {
    s.name: s
    for s in (
        StageInfo("fetch", "1", "npubuild.stages.fetch", {"model": "model.onnx"}),
        StageInfo(
            "import", "1", "npubuild.stages.importer", {"model": "canonical.onnx", "summary": "import.json"}
        ),
        StageInfo(
            "optimize",
            "1",
            "npubuild.stages.optimize.stage",
            {"model": "optimized.onnx", "log": "optimize_log.json", "summary": "optimize.json"},
        ),
        StageInfo(
            "prepare", "1", "npubuild.stages.prepare", {"tensors": "tensors.npy", "summary": "manifest.json"}
        ),
    )
}

# The stages of an npu_model in pipeline order; `--until` cuts this list. Later issues add
# calibrate, quantize, sensitivity, partition, codegen and simulate.
NPU_MODEL_PIPELINE = ("import", "optimize")
ALL_PIPELINE_STAGES = (
    "import",
    "optimize",
    "calibrate",
    "quantize",
    "sensitivity",
    "partition",
    "codegen",
    "simulate",
)
