"""codegen: the partition plan and the integer model -> model.npub and its listing."""

from __future__ import annotations

import json
from pathlib import Path

from npubuild.intmodel.interpreter import load_integer_model
from npubuild.stages.onnx_utils import load_model, write_json
from npubuild.targets.compile import compile_npub
from npubuild.targets.spec import TargetSpec


def run(params: dict, inputs: dict[str, Path], outdir: Path) -> dict[str, Path]:
    model = load_model(inputs["model"], "the optimized model")
    program, arrays, _ = load_integer_model(inputs["integer"])
    plan = json.loads(Path(inputs["plan"]).read_text())
    target = TargetSpec.model_validate(params["target"])
    data, listing, stats = compile_npub(program, arrays, model, target, plan)
    (outdir / "model.npub").write_bytes(data)
    (outdir / "model.lst").write_text(listing)
    return {
        "binary": outdir / "model.npub",
        "listing": outdir / "model.lst",
        "summary": write_json(outdir / "codegen.json", stats),
    }
