"""optimize: run the enabled passes to a fixpoint, then check the result against its input."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx

from npubuild.errors import UserError
from npubuild.stages.onnx_utils import load_model, op_histogram, save_model, write_json
from npubuild.stages.optimize import PASS_NAMES
from npubuild.stages.optimize.check import compare
from npubuild.stages.optimize.equalize import equalize_model
from npubuild.stages.optimize.graph import Graph
from npubuild.stages.optimize.passes import PASSES
from npubuild.stages.optimize.prequantized import propagate_grids, strip_qdq
from npubuild.stages.optimize.qoperator import qoperator_ops, qoperator_warning
from npubuild.stages.optimize.smooth import smooth_model


def optimize(model: onnx.ModelProto, disable: list[str], max_iterations: int) -> tuple[onnx.ModelProto, list]:
    graph = Graph(model)
    enabled = [name for name in PASS_NAMES if name not in disable]
    log = []
    for iteration in range(1, max_iterations + 1):
        graph.refresh_types()
        changes = {name: PASSES[name](graph) for name in enabled}
        log.append(
            {
                "iteration": iteration,
                "changes": {k: v for k, v in changes.items() if v},
                "nodes": len(graph.nodes),
            }
        )
        if not any(changes.values()):
            break
    propagate_grids(graph)
    if log[-1]["changes"]:  # stopped at max_iterations: the last passes' tensors have no types yet
        graph.refresh_types()
    result = onnx.shape_inference.infer_shapes(graph.to_model(), check_type=True, data_prop=True)
    graph.restore_shapes(result)
    return result, log


def run(params: dict, inputs: dict[str, Path], outdir: Path) -> dict[str, Path]:
    original = load_model(inputs["model"], "the imported model")
    optimized, log = optimize(original, params["disable"], params["max_iterations"])
    tensors = np.load(inputs["calibration"], mmap_mode="r", allow_pickle=False)
    # scale migrations (quantize settings: docs/quantization.md), after the passes' fixpoint
    equalization = smoothing = None
    if params["equalize"]:
        optimized, equalization = equalize_model(optimized)
    if params["smooth"] is not None:
        optimized, smoothing = smooth_model(
            optimized, tensors, params["smooth"], params["smooth_convolutions"]
        )
    try:
        onnx.checker.check_model(optimized)
    except onnx.checker.ValidationError as exc:
        raise UserError(
            f"internal error: optimize produced an invalid model: {str(exc).splitlines()[0]}"
        ) from None
    # a pre-quantized model is checked against itself without its Q/DQ pairs (the float model it
    # simulates); how well the integer model matches the QDQ one is evaluate's figure
    prequantized = ("absorb_qdq", "dequantize_qoperator")
    reference = (
        strip_qdq(original) if any(p in it["changes"] for it in log for p in prequantized) else original
    )
    check = compare(reference, optimized, tensors, params)
    converged = not log[-1]["changes"]
    summary = {
        "nodes_before": len(original.graph.node),
        "nodes_after": len(optimized.graph.node),
        "ops_before": op_histogram(original),
        "ops_after": op_histogram(optimized),
        "iterations": len(log),
        "converged": converged,
        "equalized": equalization,
        "smoothed": smoothing,
        "check": check,
        "warnings": [] if converged else [f"passes still changed the graph after {len(log)} iterations"],
    }
    if qoperator := qoperator_ops(original):
        summary["warnings"].append(qoperator_warning(qoperator))
    if not check["passed"]:
        bad = next(n for n, o in check["outputs"].items() if not o["passed"])
        o = check["outputs"][bad]
        raise UserError(
            f"numeric check failed: output '{bad}' differs by {o['max_abs_diff']:.3g} "
            f"(tolerance {o['tolerance']:.3g}) on {check['samples']} calibration samples"
        )
    return {
        "model": save_model(optimized, outdir / "optimized.onnx"),
        "log": write_json(outdir / "optimize_log.json", log),
        "summary": write_json(outdir / "optimize.json", summary),
    }
