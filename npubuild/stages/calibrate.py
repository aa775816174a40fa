"""calibrate: run the optimized float model over the calibration set in onnxruntime, one sample
at a time, and stream per-tensor statistics (fixed-size histograms; 8 bytes per sample and tensor
for the samples' powers)."""

from __future__ import annotations

from pathlib import Path

import onnx

from npubuild.errors import UserError
from npubuild.intmodel import tensorfile
from npubuild.stages.feeds import SampleFile, iterate_feeds, session
from npubuild.stages.onnx_utils import load_model, with_outputs, write_json
from npubuild.stages.quantize.histogram import TensorStats

_FLOAT_TYPES = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE}


def observed_tensors(model: onnx.ModelProto) -> tuple[list[str], dict[str, int]]:
    """Every float activation (graph inputs and node outputs) and, for the inputs of MAC ops, the
    channel axis whose per-channel mean (bias correction) and peak (per-channel grids) are kept."""
    types = {
        v.name: v.type.tensor_type.elem_type
        for v in [*model.graph.input, *model.graph.value_info, *model.graph.output]
    }
    initializers = {t.name for t in model.graph.initializer}
    names = [i.name for i in model.graph.input if i.name not in initializers]
    for node in model.graph.node:
        names += [o for o in node.output if o and types.get(o) in _FLOAT_TYPES]
    names = list(dict.fromkeys(names))
    ranks = {v.name: len(v.type.tensor_type.shape.dim) for v in [*model.graph.input, *model.graph.value_info]}
    axes = {}
    for node in model.graph.node:
        if node.op_type in ("Conv", "ConvTranspose") and node.input[0] in ranks:
            axes[node.input[0]] = 1
        elif node.op_type in ("MatMul", "Gemm") and node.input[0] in ranks:
            axes[node.input[0]] = ranks[node.input[0]] - 1
    return names, axes


def run(params: dict, inputs: dict[str, Path], outdir: Path) -> dict[str, Path]:
    model = load_model(inputs["model"], "the optimized model")
    tensors = SampleFile(inputs["calibration"])
    if len(tensors) == 0:
        raise UserError("the calibration set has no samples")
    names, axes = observed_tensors(model)
    probe = with_outputs(model, names)
    sess = session(probe)
    stats = {name: TensorStats() for name in names}
    samples = 0
    for feed in iterate_feeds(model, tensors, len(tensors)):
        samples += 1
        for name, value in zip(names, sess.run(names, feed)):
            stats[name].update(value, axes.get(name))
    arrays, meta = {}, {}
    nonfinite = []
    for name, s in stats.items():
        record, tensor_arrays = s.to_record()
        meta[name] = record
        if record["nonfinite"]:
            nonfinite.append(name)
        for key, value in tensor_arrays.items():
            arrays[f"{name}/{key}"] = value
    tensorfile.save(outdir / "stats.npbt", arrays, {"samples": samples, "tensors": meta})
    warnings = (
        [
            f"{len(nonfinite)} tensors had NaN/Inf values during calibration (left out of their ranges): "
            f"{', '.join(nonfinite[:3])}"
        ]
        if nonfinite
        else []
    )
    summary = {"samples": samples, "tensors": len(names), "warnings": warnings}
    return {"stats": outdir / "stats.npbt", "summary": write_json(outdir / "calibrate.json", summary)}
