"""quantize: statistics + settings -> the integer model (quantized.npq) and its QDQ ONNX twin."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from npubuild.errors import UserError
from npubuild.intmodel import tensorfile
from npubuild.intmodel.program import parse
from npubuild.stages.onnx_utils import load_model, save_model, write_json
from npubuild.stages.optimize.graph import recorded_grids
from npubuild.stages.quantize.absorb import absorb_into_tables, known_ranks
from npubuild.stages.quantize.integer_model import build_integer_model
from npubuild.stages.quantize.precision import Layers, load_table, precision_overrides
from npubuild.stages.quantize.qdq import export_qdq


def run(params: dict, inputs: dict[str, Path], outdir: Path) -> dict[str, Path]:
    model = load_model(inputs["model"], "the optimized model")
    if "stats" in inputs:
        stats_arrays, stats = tensorfile.load(inputs["stats"])
    elif recorded_grids(model):  # a pre-quantized model without a calibration set: its own grids only
        stats_arrays, stats = {}, {"tensors": {}}
    else:
        raise UserError(
            "the model carries no quantization parameters (no QuantizeLinear/DequantizeLinear pairs): "
            "give the npu_model a calibration set"
        )
    warnings: list[str] = []
    if "precision" in inputs:
        table = load_table(inputs["precision"])
        layers = Layers(model, stats["tensors"], stats_arrays, params)
        warnings += [
            f"precision table names '{n}', which is not a node of the model" for n in layers.unknown(table)
        ]
        params = {
            **params,
            "overrides": list(params["overrides"]) + precision_overrides(layers.expand(table)),
        }
    program, meta, arrays = build_integer_model(model, stats["tensors"], stats_arrays, params, absorb=False)
    try:  # from every op the float graph has (the tables have not absorbed any yet)
        qdq = export_qdq(
            model, parse(meta, "the integer model quantize made"), arrays, params.get("qdq_export", "exact")
        )
    except NotImplementedError as exc:
        raise UserError(f"cannot export a QDQ model: {exc}") from None
    meta, arrays = absorb_into_tables(meta, arrays, known_ranks(model))
    tensorfile.save(outdir / "quantized.npq", arrays, meta)
    integer = parse(meta, "the integer model quantize made")  # what every later stage reads
    kinds = Counter(op.kind for op in integer.ops)
    bits = Counter(t.bits for t in integer.tensors.values())
    summary = {
        "integer_ops": sum(n for k, n in kinds.items() if k not in ("float", "quantize")),
        "float_ops": len(program.float_nodes),
        "float_nodes": program.float_nodes,
        "op_kinds": dict(sorted(kinds.items())),
        "tensor_bits": {str(k): v for k, v in sorted(bits.items())},
        "settings": params,
        "warnings": warnings + program.warnings,
    }
    return {
        "integer": outdir / "quantized.npq",
        "qdq": save_model(qdq, outdir / "quantized.qdq.onnx"),
        "summary": write_json(outdir / "quantize.json", summary),
    }
