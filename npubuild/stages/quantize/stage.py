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
    rounding = None
    if params["weight_rounding"] == "gptq" and "calibration" in inputs:
        grams, samples = _weight_grams(model, inputs["calibration"])
        stats_arrays = {**stats_arrays, **grams}
        rounding = {"method": "gptq", "layers": len(grams), "samples": samples}
    program, meta, arrays = build_integer_model(model, stats["tensors"], stats_arrays, params, absorb=False)
    absorbed_meta, absorbed = absorb_into_tables(meta, arrays, known_ranks(model))
    integer = parse(absorbed_meta, "the integer model quantize made")  # what every later stage reads
    corrected, bias_summary = {}, None
    if params["empirical_bias"] and "calibration" in inputs:
        corrected, bias_summary = _empirical_bias(model, integer, absorbed, inputs["calibration"])
        arrays = {**arrays, **corrected}  # the same MAC layers before the tables absorbed anything
    try:  # from every op the float graph has (the tables have not absorbed any yet)
        qdq = export_qdq(model, parse(meta, "the integer model quantize made"), arrays, params["qdq_export"])
    except NotImplementedError as exc:
        raise UserError(f"cannot export a QDQ model: {exc}") from None
    meta, arrays = absorbed_meta, {**absorbed, **corrected}
    tensorfile.save(outdir / "quantized.npq", arrays, meta)
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
    if rounding is not None:
        summary["weight_rounding"] = rounding
    if bias_summary is not None:
        summary["empirical_bias"] = bias_summary
    return {
        "integer": outdir / "quantized.npq",
        "qdq": save_model(qdq, outdir / "quantized.qdq.onnx"),
        "summary": write_json(outdir / "quantize.json", summary),
    }


def _weight_grams(model, calibration: Path) -> tuple[dict, int]:
    """Each GPTQ-rounded layer's input correlations (gptq.py) as '<node>/gram' arrays, and how
    many samples made them."""
    from onnx import numpy_helper

    from npubuild.stages.feeds import SampleFile, spread_feeds
    from npubuild.stages.quantize import gptq

    feeds = spread_feeds(model, SampleFile(calibration), gptq.MAX_SAMPLES)
    constants = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    grams = gptq.gram_matrices(model, constants, feeds) if feeds else {}
    return {f"{label}/gram": gram for label, gram in grams.items()}, len(feeds)


def _empirical_bias(model, integer, arrays: dict, calibration: Path) -> tuple[dict, dict]:
    """The MAC layers' corrected biases (empirical_bias.py) on the calibration samples."""
    from npubuild.intmodel.interpreter import interpreter_for
    from npubuild.stages.feeds import SampleFile, feed_count, iterate_feeds, spread_feeds
    from npubuild.stages.quantize import empirical_bias as eb

    tensors = SampleFile(calibration)
    count = feed_count(model, tensors)
    float_names = {o for n in model.graph.node for o in n.output} | {i.name for i in model.graph.input}
    macs = eb.correctable(integer, float_names)
    if not count or not macs:
        return {}, eb.correction_summary(len(eb.sample_indices(count)), 0, 0, 0.0)
    working = dict(arrays)
    interpreter = interpreter_for(integer, working)
    # as many samples as the memory budget holds side by side (one sample measures the peak)
    first = next(iterate_feeds(model, tensors, 1))
    limit = eb.samples_within(eb.peak_live_bytes(integer, interpreter, first))
    feeds = spread_feeds(model, tensors, limit)
    means = eb.float_means(model, macs, feeds)
    return eb.correct_biases(integer, working, interpreter, means, feeds)
