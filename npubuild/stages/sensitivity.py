"""sensitivity: how much each layer's quantization costs in output accuracy, two ways.

quantized alone: only this layer int8, the rest float (the damage it does by itself);
float alone: every layer int8 but this one (what keeping it float buys back).
Both on a subset of the evaluation set, through the precision probe (no recalibration: the
calibration statistics and the float reference outputs are reused). The ranking orders layers
by the sum of the two effects, most sensitive first.
"""

from __future__ import annotations

from pathlib import Path

from npubuild.intmodel import tensorfile
from npubuild.stages.feeds import SampleFile, iterate_feeds, search_split
from npubuild.stages.onnx_utils import load_model, write_json
from npubuild.stages.quantize.cost import op_work
from npubuild.stages.quantize.probe import PrecisionProbe


def run(params: dict, inputs: dict[str, Path], outdir: Path) -> dict[str, Path]:
    model = load_model(inputs["model"], "the optimized model")
    stats_arrays, stats = tensorfile.load(inputs["stats"])
    # the search half of the evaluation set: the held-out half judges the search's answer
    evaluation = list(iterate_feeds(model, SampleFile(inputs["evaluation"]), 2 * params["samples"]))
    feeds = search_split(evaluation)[0]
    # int8 tables only: a probe without the int16 pairs, unless the settings themselves plan
    # 16-bit tensors (activation_bits 16, a Softmax output's grid)
    planned = PrecisionProbe.planned_widths(model, stats["tensors"], stats_arrays, params["quantize"])
    probe = PrecisionProbe(model, stats["tensors"], stats_arrays, params["quantize"], feeds, planned)
    units = probe.layers.units
    all_int8 = probe.run({})
    all_float = {u: "float" for u in units}
    work = op_work(model)
    rows = []
    for unit in units:
        alone = probe.run({**all_float, unit: "int8"})
        kept = probe.run({unit: "float"})
        score = (1 - alone["cosine"]) + (kept["cosine"] - all_int8["cosine"])
        rows.append(
            {
                "node": unit,
                "op_type": work[unit]["op_type"],
                "macs": work[unit]["macs"],
                "quantized_alone": alone,
                "float_alone": kept,
                "score": score,
            }
        )
    ranking = [r["node"] for r in sorted(rows, key=lambda r: (-r["score"], r["node"]))]
    report = {
        "samples": len(feeds),
        "int8": all_int8,
        "layers": rows,
        "ranking": ranking,
        "probe_runs": probe.runs,
        "warnings": [],
    }
    return {"report": write_json(outdir / "sensitivity.json", report)}
