"""sensitivity: how much each layer's quantization costs in output accuracy, two ways.

quantized alone: only this layer int8, the rest float (the damage it does by itself), for every
layer: the search orders its promotions by it;
float alone: every layer int8 but this one (what keeping it float buys back), for the
FLOAT_ALONE_LAYERS layers that do the most damage alone: it is a figure for the reports (which show
at most that many layers), and measuring it for every layer doubled the pass (PP-OCRv4 det at 480:
184 layers, 369 probe runs, 90 s; with the shortlist 210 runs, 45-49 s).
Both on a subset of the evaluation set, through the precision probe (no recalibration: the
calibration statistics and the float reference outputs are reused). The ranking puts those layers
first, by the sum of the two effects, then the others by their damage alone.
"""

from __future__ import annotations

from pathlib import Path

from npubuild.intmodel import tensorfile
from npubuild.stages.feeds import SampleFile, iterate_feeds, search_split
from npubuild.stages.onnx_utils import load_model, write_json
from npubuild.stages.quantize.cost import op_work
from npubuild.stages.quantize.probe import PrecisionProbe

FLOAT_ALONE_LAYERS = 25  # the HTML report's sensitivity chart shows 25 layers, the text report 15


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
    rows = {
        unit: {
            "node": unit,
            "op_type": work[unit]["op_type"],
            "macs": work[unit]["macs"],
            "quantized_alone": probe.run({**all_float, unit: "int8"}),
            "float_alone": None,
        }
        for unit in units
    }

    def damage(unit: str) -> float:
        return 1 - rows[unit]["quantized_alone"]["cosine"]

    by_damage = sorted(units, key=lambda u: (-damage(u), u))
    shortlist = by_damage[:FLOAT_ALONE_LAYERS]
    for unit in shortlist:
        kept = probe.run({unit: "float"})
        rows[unit]["float_alone"] = kept
        rows[unit]["score"] = damage(unit) + (kept["cosine"] - all_int8["cosine"])
    for unit in by_damage[FLOAT_ALONE_LAYERS:]:
        rows[unit]["score"] = damage(unit)
    ranking = sorted(shortlist, key=lambda u: (-rows[u]["score"], u)) + by_damage[FLOAT_ALONE_LAYERS:]
    report = {
        "samples": len(feeds),
        "int8": all_int8,
        "layers": [rows[u] for u in units],
        "ranking": ranking,
        "float_alone_layers": len(shortlist),
        "probe_runs": probe.runs,
        "warnings": [],
    }
    return {"report": write_json(outdir / "sensitivity.json", report)}
