"""evaluate: the integer model against the float model on the evaluation set.

Per layer: cosine and SQNR of every quantized tensor (dequantized) against the float model's same
tensor; per output: cosine, SQNR, max abs error, and the samples that carry most of its error
(named by the data set's files), with a warning when one carries most of it. And the golden
interpreter against the QDQ model in onnxruntime: the share of output elements within +-1 LSB.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from npubuild.errors import UserError
from npubuild.intmodel.codes import dequantize, qrange
from npubuild.intmodel.interpreter import load_integer_model
from npubuild.intmodel.ops import LUT_OPS
from npubuild.stages.feeds import samples_for, session
from npubuild.stages.metrics import (
    Agreement,
    Clipping,
    OpAgreement,
    Top1,
    class_axis,
    dominant_sample_warning,
    worst_samples,
)
from npubuild.stages.onnx_utils import load_model, tensor_readers, with_outputs, write_json
from npubuild.stages.parallel import in_order, sample_workers
from npubuild.stages.quantize.qdq import codes_name
from npubuild.stages.quantize.tables import activation_function

OP_BY_OP_SAMPLES = 2
EXPORT_COSINE = 0.999  # below this the QDQ export is a different model (issue 16)
# A tensor the evaluation images drive beyond its calibration range by more than this share of
# that range's span is one the calibration set did not cover; past COVERAGE_SHARE of the tensors,
# a warning. Set where the corpus's photo models (YOLOv8n, orientation, rec: at most 2.5% of their
# tensors on both splits) stay quiet and the text models calibrated without printed text (det
# 10%, cls 16-18%) do not (docs/quantization.md, "Calibration coverage").
COVERAGE_SPAN = 0.25
COVERAGE_SHARE = 0.05


Extremes = dict[str, tuple[float, float]]  # tensor -> (min, max)


def calibration_coverage(calibrated: Extremes, seen: Extremes) -> dict:
    """Which tensors the evaluation images (`seen`: name -> (min, max)) drive beyond their
    calibration range (`calibrated`) by more than COVERAGE_SPAN of its span; the worst five."""
    excess = {}
    for name, (lo, hi) in seen.items():
        c_lo, c_hi = calibrated[name]
        if c_hi > c_lo:
            excess[name] = max(hi - c_hi, c_lo - lo, 0.0) / (c_hi - c_lo)
    beyond = sorted((n for n, e in excess.items() if e > COVERAGE_SPAN), key=lambda n: (-excess[n], n))
    return {
        "tensors": len(excess),
        "beyond": len(beyond),
        "span": COVERAGE_SPAN,
        "worst": [{"tensor": n, "excess": round(excess[n], 4)} for n in beyond[:5]],
    }


def coverage_warning(coverage: dict) -> list[str]:
    """The warning a build prints when the calibration set did not cover the evaluation images."""
    if not coverage["tensors"] or coverage["beyond"] <= COVERAGE_SHARE * coverage["tensors"]:
        return []
    worst = coverage["worst"][0]
    return [
        f"the evaluation images drive {coverage['beyond']} of {coverage['tensors']} tensors beyond "
        f"their calibration range by more than {coverage['span']:.0%} of its span (most: "
        f"'{worst['tensor']}', {worst['excess']:.0%}): the calibration set does not show the model "
        "what evaluation does; the integer model's accuracy on such images rests on ranges it never saw"
    ]


def _class_axis(model, output: str, declared: dict[str, int]) -> int:
    outputs = [o.name for o in model.graph.output]
    unknown = sorted(set(declared) - set(outputs))
    if unknown:
        raise UserError(
            f"class_axes names {unknown}, which the model does not output (its outputs: {outputs})"
        )
    if output not in declared:
        return class_axis(model, output)
    rank = next(len(o.type.tensor_type.shape.dim) for o in model.graph.output if o.name == output)
    if not -rank <= declared[output] < rank:
        raise UserError(f"class_axes['{output}'] = {declared[output]}, but the output has {rank} axes")
    return declared[output]


def feed_sources(manifest: Path | None, tensors: np.ndarray, feeds: list[dict]) -> list[str]:
    """Where each feed's samples came from (the data set's manifest lists one file per sample; a
    feed of a batched input holds several), else "sample K"."""
    listed: list = []
    if manifest is not None:
        recorded = json.loads(Path(manifest).read_text())
        # the manifest is prepare's own artifact; anything but its object lists no sources
        sources = recorded.get("sources") if isinstance(recorded, dict) else None
        listed = sources if isinstance(sources, list) else []
    per_feed = 1  # a named record is one feed; a stack's feed is a batch of its samples
    if feeds and not tensors.dtype.names:
        per_feed = int(next(iter(feeds[0].values())).shape[0])
    if not all(isinstance(s, str) for s in listed) or len(listed) < per_feed * len(feeds):
        return [f"sample {k}" for k in range(len(feeds))]
    return [", ".join(dict.fromkeys(listed[k * per_feed : (k + 1) * per_feed])) for k in range(len(feeds))]


def grid_ends(t, ndim: int) -> tuple:
    """The smallest and largest values a tensor's grid holds, and its step (per channel for a
    per-channel grid, shaped to broadcast over an `ndim`-dimensional tensor)."""
    qmin, qmax = qrange(t.bits)
    scales = t.channel_scales(ndim)
    return (qmin - t.zero_point) * scales, (qmax - t.zero_point) * scales, scales


def read_through(readers: list, is_output: bool) -> dict:
    """`{"read_through": op}` for a tensor whose one reader is a lookup-table activation: its range
    was chosen by the error after that function (ranges.mse_through), so it clips where the
    function is flat on purpose (PP-OCRv4 det's last transposed convolution: 98% of its values
    past its grid's ends, where the Sigmoid after it is within 2.1e-4 of 0 or 1). Its clipping is
    judged after the function, as the activation's result sees it."""
    if len(readers) == 1 and readers[0].op_type in LUT_OPS and not is_output:
        return {"read_through": readers[0].op_type}
    return {}


def run(params: dict, inputs: dict[str, Path], outdir: Path) -> dict[str, Path]:
    model = load_model(inputs["model"], "the optimized model")
    program, arrays, interpreter = load_integer_model(inputs["integer"])
    qdq = load_model(inputs["qdq"], "the QDQ model")
    tensors = np.load(inputs["evaluation"], mmap_mode="r", allow_pickle=False)
    feeds = samples_for(model, tensors, params["samples"])
    # Layers to compare: every quantized tensor the float model also has (not its inputs).
    # in graph order (the order a user reads the network in), not the tensors' name order
    position = {o: (k, j) for k, n in enumerate(model.graph.node) for j, o in enumerate(n.output)}
    layer_names = sorted((t for t in program.tensors if t in position), key=position.__getitem__)
    probe = with_outputs(model, layer_names)
    # The QDQ model with every quantized tensor's integer codes (the QuantizeLinear outputs) exposed.
    code_of = {t: codes_name(qdq, t) for t in program.tensors}
    code_names = list(code_of.values())
    qdq_probe = with_outputs(qdq, code_names)
    qdq_fetch = [o.name for o in qdq.graph.output] + code_names
    float_session, qdq_session = session(probe), session(qdq_probe)
    op_by_op = OpAgreement()
    fetch = list(dict.fromkeys([o.name for o in model.graph.output] + layer_names))
    outputs = {o.name: Agreement() for o in model.graph.output}
    top1 = {
        o.name: Top1(_class_axis(model, o.name, params.get("class_axes", {}))) for o in model.graph.output
    }
    layers = {name: Agreement() for name in layer_names}
    clipping = {name: Clipping() for name in layer_names}
    read_by = tensor_readers(model.graph.node)
    network_outputs = {o.name for o in model.graph.output}
    via = {name: read_through(read_by.get(name, []), name in network_outputs) for name in layer_names}
    # a tensor only a table activation reads: its clipping is judged after that function, against
    # the activation's own result (when that is a layer too)
    through = {
        name: (activation_function(read_by[name][0]), read_by[name][0].output[0])
        for name in layer_names
        if via[name] and read_by[name][0].output[0] in layers
    }
    # the QDQ export against the integer model, every output (float outputs too): what a user who
    # deploys the export gets, measured rather than assumed
    export = {o.name: Agreement() for o in model.graph.output}
    within, total, exact = 0, 0, 0
    calibrated = {}
    if "stats" in inputs:
        from npubuild.intmodel import tensorfile

        stats = tensorfile.load(inputs["stats"])[1]["tensors"]
        calibrated = {
            name: (float(stats[name]["min"]), float(stats[name]["max"]))
            for name in layer_names
            if name in stats and stats[name].get("count")
        }
    covered = [name for name in layer_names if name in calibrated]
    seen: Extremes = {}

    def measure(feed: dict) -> tuple:
        """One sample through the three models; the layers' codes dequantized here, in the worker."""
        reference = dict(zip(fetch, float_session.run(fetch, feed)))
        result, env = interpreter.run(feed, keep=True)
        qdq_out = dict(zip(qdq_fetch, qdq_session.run(qdq_fetch, feed)))
        layer_terms = {
            name: Agreement.terms(reference[name], dequantize(env[name], program.tensors[name]))
            for name in layers
        }
        clip_terms = {
            name: Clipping.terms(
                reference[name],
                *grid_ends(program.tensors[name], reference[name].ndim),
                through[name][0] if name in through else None,
            )
            for name in layers
        }
        codes = {name: env[name] for name in program.outputs if name in program.tensors}
        extremes = {n: (float(np.min(reference[n])), float(np.max(reference[n]))) for n in covered}
        return reference, result, (layer_terms, clip_terms), codes, qdq_out, extremes

    # Samples run in threads (numpy, BLAS and onnxruntime release the GIL); every sum below takes
    # them in sample order, so the report does not depend on the worker count.
    errors: dict[str, list[float]] = {name: [] for name in outputs}  # each sample's, per output
    for reference, result, (layer_terms, clip_terms), codes, qdq_out, extremes in in_order(
        measure, feeds, sample_workers()
    ):
        for name, (lo, hi) in extremes.items():
            seen_lo, seen_hi = seen.get(name, (lo, hi))
            seen[name] = (min(seen_lo, lo), max(seen_hi, hi))
        for name, agreement in outputs.items():
            terms = Agreement.terms(reference[name], result[name])
            agreement.add(terms)
            errors[name].append(terms[3])
            top1[name].update(reference[name], result[name])
        for name, agreement in layers.items():
            agreement.add(layer_terms[name])
            clipping[name].add(clip_terms[name])
        for name, agreement in export.items():
            agreement.update(result[name], qdq_out[name])
        if op_by_op.samples < OP_BY_OP_SAMPLES:
            op_by_op.update(interpreter, program, {t: qdq_out[code_of[t]] for t in program.tensors})
        for name, value in codes.items():
            t = program.tensors[name]
            expected = np.rint(qdq_out[name].astype(np.float64) / t.scale) + t.zero_point
            diff = np.abs(expected - value)
            within += int((diff <= 1).sum())
            exact += int((diff == 0).sum())
            total += diff.size
    producers = {o: n for n in model.graph.node for o in n.output}
    fine, tail = program.fine_preactivations(), program.result_tail()
    layer_rows = []
    for name, agreement in layers.items():
        node = producers[name]
        # a node with several outputs (Split) is one row per output: say which
        which = {"output": list(node.output).index(name)} if len(node.output) > 1 else {}
        layer_rows.append(
            {
                "tensor": name,
                "node": node.name or name,
                **which,
                "op_type": node.op_type,
                "bits": program.tensors[name].bits,
                **({"preactivation": True} if name in fine else {}),
                **via[name],
                **({"result": True} if name in tail else {}),
                **agreement.result(),
                **clipping[name].result(agreement, layers[through[name][1]] if name in through else None),
            }
        )
    worst = sorted(layer_rows, key=lambda r: (r["sqnr_db"], r["cosine"]))[:5]
    sources = feed_sources(inputs.get("sources"), tensors, feeds)
    worst_by_output = {name: worst_samples(e, sources) for name, e in errors.items()}
    coverage = calibration_coverage(calibrated, seen) if calibrated else None
    report = {
        "samples": len(feeds),
        "outputs": {name: {**a.result(), **top1[name].result()} for name, a in outputs.items()},
        "layers": layer_rows,
        "worst_layers": [r["tensor"] for r in worst],
        "worst_samples": worst_by_output,
        "float_nodes": [f.model_dump() for f in program.float_nodes],
        "golden_vs_qdq": {
            "op_by_op": op_by_op.result(),
            "end_to_end_outputs": {
                "elements": total,
                "within_1_lsb": within / total if total else None,
                "exact": exact / total if total else None,
            },
            "outputs": {name: a.result() for name, a in export.items()},
        },
        **({"calibration_coverage": coverage} if coverage is not None else {}),
        "warnings": [
            f"the QDQ export and the integer model agree only at cosine {a.result()['cosine']:.4f} on "
            f"output '{name}' (below {EXPORT_COSINE}): the export does not compute what the integer "
            "model computes"
            for name, a in export.items()
            if a.result().get("cosine", 1.0) < EXPORT_COSINE
        ]
        + [
            w
            for name, rows in worst_by_output.items()
            if (w := dominant_sample_warning(name, rows, len(feeds))) is not None
        ]
        + (coverage_warning(coverage) if coverage is not None else []),
    }
    return {"report": write_json(outdir / "accuracy.json", report)}
