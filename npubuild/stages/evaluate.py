"""evaluate: the integer model against the float model on the evaluation set.

Per layer: cosine and SQNR of every quantized tensor (dequantized) against the float model's same
tensor; per output: cosine, SQNR, max abs error. And the golden interpreter against the QDQ model
in onnxruntime: the share of output elements within +-1 LSB.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import onnx

from npubuild.intmodel import tensorfile
from npubuild.intmodel.codes import dequantize
from npubuild.intmodel.interpreter import Interpreter
from npubuild.stages.onnx_utils import load_model, with_outputs, write_json
from npubuild.stages.optimize.check import samples_for, session
from npubuild.stages.reductions import dot


class Agreement:
    """Streaming cosine / SQNR / max-abs-error between a reference and a candidate tensor."""

    def __init__(self) -> None:
        self.dot = self.ref2 = self.cand2 = self.err2 = 0.0
        self.max_abs = 0.0
        self.count = 0
        self.nonfinite = 0

    def update(self, ref: np.ndarray, cand: np.ndarray) -> None:
        r = np.asarray(ref, np.float64).reshape(-1)
        c = np.asarray(cand, np.float64).reshape(-1)
        finite = np.isfinite(r) & np.isfinite(c)
        if not finite.all():  # NaN/Inf (e.g. log of 0) cannot be compared; count them instead
            self.nonfinite += int((~finite).sum())
            r, c = r[finite], c[finite]
        d = r - c
        self.dot += dot(r, c)
        self.ref2 += dot(r, r)
        self.cand2 += dot(c, c)
        self.err2 += dot(d, d)
        self.max_abs = max(self.max_abs, float(np.max(np.abs(d))) if d.size else 0.0)
        self.count += r.size

    def result(self) -> dict:
        denom = math.sqrt(self.ref2 * self.cand2)
        cosine = self.dot / denom if denom > 0 else (1.0 if self.err2 == 0 else 0.0)
        if self.err2 == 0:
            sqnr = 200.0
        elif self.ref2 == 0:
            sqnr = -200.0
        else:
            sqnr = 10 * math.log10(self.ref2 / self.err2)
        result = {"cosine": round(cosine, 7), "sqnr_db": round(sqnr, 3), "max_abs_error": self.max_abs}
        if self.nonfinite:
            result["nonfinite_elements"] = self.nonfinite
        return result


OP_BY_OP_SAMPLES = 2


class Top1:
    """How often the integer model's arg-max over axis 1 (the class axis of NCHW / N x classes
    outputs) equals the float model's, over every other position."""

    def __init__(self) -> None:
        self.agree = self.total = 0

    def update(self, ref: np.ndarray, cand: np.ndarray) -> None:
        ref, cand = np.asarray(ref), np.asarray(cand)
        if ref.ndim < 2 or ref.shape[1] < 2 or ref.shape != cand.shape:
            return
        same = np.argmax(ref, axis=1) == np.argmax(cand, axis=1)
        self.agree += int(same.sum())
        self.total += same.size

    def result(self) -> dict:
        return {"top1_agreement": self.agree / self.total} if self.total else {}


class OpAgreement:
    """Each integer op of the golden interpreter against the QDQ model in onnxruntime, fed the same
    integer inputs (the QDQ model's codes), so differences do not compound from layer to layer."""

    def __init__(self) -> None:
        self.samples = 0
        self.by_kind: dict[str, list[int]] = {}  # kind -> [elements, within 1 LSB, exact]

    def update(self, interpreter: Interpreter, program: dict, codes: dict[str, np.ndarray]) -> None:
        self.samples += 1
        for op in program["ops"]:
            if op["kind"] in ("float", "quantize"):
                continue
            env = {i: codes[i].astype(np.int32) for i in op["inputs"] if i in codes}
            getattr(interpreter, f"_{op['kind']}")(op, env)
            counts = self.by_kind.setdefault(op["kind"], [0, 0, 0])
            for out in op["outputs"]:
                if out in codes:
                    diff = np.abs(env[out].astype(np.int64) - codes[out].astype(np.int64))
                    counts[0] += diff.size
                    counts[1] += int((diff <= 1).sum())
                    counts[2] += int((diff == 0).sum())

    def result(self) -> dict:
        total = sum(c[0] for c in self.by_kind.values())
        return {
            "samples": self.samples,
            "elements": total,
            "within_1_lsb": sum(c[1] for c in self.by_kind.values()) / total if total else None,
            "exact": sum(c[2] for c in self.by_kind.values()) / total if total else None,
            "by_kind": {
                k: {"elements": c[0], "within_1_lsb": c[1] / c[0], "exact": c[2] / c[0]}
                for k, c in sorted(self.by_kind.items())
                if c[0]
            },
        }


def load_integer_model(path: Path) -> tuple[dict, dict, Interpreter]:
    arrays, program = tensorfile.load(path)
    functions = []
    for key in program["functions"]:
        f = onnx.FunctionProto()
        f.ParseFromString(arrays[key].tobytes())
        functions.append(f)
    return program, arrays, Interpreter(program, arrays, functions, {"": program["opset"], "npubuild": 1})


def run(params: dict, inputs: dict[str, Path], outdir: Path) -> dict[str, Path]:
    model = load_model(inputs["model"], "the optimized model")
    program, arrays, interpreter = load_integer_model(inputs["integer"])
    qdq = load_model(inputs["qdq"], "the QDQ model")
    tensors = np.load(inputs["evaluation"], mmap_mode="r", allow_pickle=False)
    feeds = samples_for(model, tensors, params["samples"])
    # Layers to compare: every quantized tensor the float model also has (not its inputs).
    produced = {o for n in model.graph.node for o in n.output}
    layer_names = [t for t in program["tensors"] if t in produced]
    probe = with_outputs(model, layer_names)
    # The QDQ model with every quantized tensor's integer codes (the QuantizeLinear outputs) exposed.
    code_names = [f"{t}__q" for t in program["tensors"]]
    qdq_probe = with_outputs(qdq, code_names)
    qdq_fetch = [o.name for o in qdq.graph.output] + code_names
    float_session, qdq_session = session(probe), session(qdq_probe)
    op_by_op = OpAgreement()
    fetch = list(dict.fromkeys([o.name for o in model.graph.output] + layer_names))
    outputs = {o.name: Agreement() for o in model.graph.output}
    top1 = {o.name: Top1() for o in model.graph.output}
    layers = {name: Agreement() for name in layer_names}
    within, total, exact = 0, 0, 0
    for feed in feeds:
        reference = dict(zip(fetch, float_session.run(fetch, feed)))
        result, env = interpreter.run(feed, keep=True)
        for name, agreement in outputs.items():
            agreement.update(reference[name], result[name])
            top1[name].update(reference[name], result[name])
        for name, agreement in layers.items():
            agreement.update(reference[name], dequantize(env[name], program["tensors"][name]))
        qdq_out = dict(zip(qdq_fetch, qdq_session.run(qdq_fetch, feed)))
        if op_by_op.samples < OP_BY_OP_SAMPLES:
            op_by_op.update(interpreter, program, {t: qdq_out[f"{t}__q"] for t in program["tensors"]})
        for name in program["outputs"]:
            t = program["tensors"].get(name)
            if t is None:
                continue
            codes = np.rint(qdq_out[name].astype(np.float64) / t["scale"]) + t["zero_point"]
            diff = np.abs(codes - env[name])
            within += int((diff <= 1).sum())
            exact += int((diff == 0).sum())
            total += diff.size
    producers = {o: n for n in model.graph.node for o in n.output}
    layer_rows = []
    for name, agreement in layers.items():
        node = producers[name]
        layer_rows.append(
            {
                "tensor": name,
                "node": node.name or name,
                "op_type": node.op_type,
                "bits": program["tensors"][name]["bits"],
                **agreement.result(),
            }
        )
    worst = sorted(layer_rows, key=lambda r: (r["sqnr_db"], r["cosine"]))[:5]
    report = {
        "samples": len(feeds),
        "outputs": {name: {**a.result(), **top1[name].result()} for name, a in outputs.items()},
        "layers": layer_rows,
        "worst_layers": [r["tensor"] for r in worst],
        "float_nodes": program["float_nodes"],
        "golden_vs_qdq": {
            "op_by_op": op_by_op.result(),
            "end_to_end_outputs": {
                "elements": total,
                "within_1_lsb": within / total if total else None,
                "exact": exact / total if total else None,
            },
        },
        "warnings": [],
    }
    return {"report": write_json(outdir / "accuracy.json", report)}
