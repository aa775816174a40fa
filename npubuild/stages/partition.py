"""partition: which integer-model ops the target's NPU runs, which fall back to the CPU and why."""

from __future__ import annotations

from pathlib import Path

from npubuild.intmodel.interpreter import load_integer_model
from npubuild.stages.onnx_utils import load_model, write_json
from npubuild.targets.compile import plan_partition
from npubuild.targets.spec import TargetSpec


def run(params: dict, inputs: dict[str, Path], outdir: Path) -> dict[str, Path]:
    model = load_model(inputs["model"], "the optimized model")
    program, arrays, _ = load_integer_model(inputs["integer"])
    target = TargetSpec.model_validate(params["target"])
    plan = plan_partition(program, arrays, model, target)
    plan["warnings"] = [
        f"{f['node']} runs on the CPU: {f['reason']}"
        for f in plan["fallbacks"]
        if f["kind"] not in ("quantize", "float")
    ]
    return {"plan": write_json(outdir / "partition.json", plan)}
