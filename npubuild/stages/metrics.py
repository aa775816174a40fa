"""How close two models' tensors are: streaming cosine, SQNR and max error; top-1 agreement; and
the golden interpreter op by op against the QDQ model's codes."""

from __future__ import annotations

import math

import numpy as np

from npubuild.intmodel.interpreter import Interpreter
from npubuild.intmodel.ops import MOVE_OPS
from npubuild.intmodel.program import IntegerModel
from npubuild.stages.onnx_utils import recorded_shapes
from npubuild.stages.reductions import dot


class Agreement:
    """Streaming cosine / SQNR / max-abs-error between a reference and a candidate tensor."""

    def __init__(self) -> None:
        self.dot = self.ref2 = self.cand2 = self.err2 = 0.0
        self.max_abs = 0.0
        self.count = 0
        self.nonfinite = 0

    def update(self, ref: np.ndarray, cand: np.ndarray) -> None:
        self.add(Agreement.terms(ref, cand))

    @staticmethod
    def terms(ref: np.ndarray, cand: np.ndarray) -> tuple:
        """One sample's sums (dot, |r|^2, |c|^2, |r-c|^2, max|r-c|, elements, non-finite): the
        heavy part, computed wherever the sample is; `add` takes them in sample order."""
        # float32 tensors stay float32 here: every product, sum and difference is taken in float64
        # (dot, np.subtract below) from the exact float64 value of each element
        r = np.asarray(ref).reshape(-1)
        c = np.asarray(cand).reshape(-1)
        # a sum of squares of float32-range values is finite exactly when every value is: the
        # usual case costs no extra pass
        r2, c2 = dot(r, r), dot(c, c)
        nonfinite = 0
        if not (np.isfinite(r2) and np.isfinite(c2)):
            # NaN/Inf (e.g. log of 0) cannot be compared; count them instead
            finite = np.isfinite(r) & np.isfinite(c)
            nonfinite = int((~finite).sum())
            r, c = r[finite], c[finite]
            r2, c2 = dot(r, r), dot(c, c)
        d = np.subtract(r, c, dtype=np.float64)
        max_abs = float(np.max(np.abs(d))) if d.size else 0.0
        return dot(r, c), r2, c2, dot(d, d), max_abs, r.size, nonfinite

    def add(self, terms: tuple) -> None:
        rc, r2, c2, d2, max_abs, count, nonfinite = terms
        self.dot += rc
        self.ref2 += r2
        self.cand2 += c2
        self.err2 += d2
        self.max_abs = max(self.max_abs, max_abs)
        self.count += count
        self.nonfinite += nonfinite

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


class Clipping:
    """What a tensor's integer grid cannot hold of its float values: the squared error that
    clipping alone gives (each value beyond the grid's ends less that end), and in how many samples
    any value fell beyond. Set against the layer's whole error it says whether the layer lost its
    accuracy to rounding or to a range too narrow for these images (PP-OCR cls's first
    squeeze-excite bottleneck on the validation lines: 14 of 16 past the calibration maximum, the
    layer at 21.523 dB and clipping alone at 21.525; docs/quantization.md)."""

    def __init__(self) -> None:
        self.err2 = 0.0
        self.values = 0
        self.samples = 0

    @staticmethod
    def terms(ref: np.ndarray, lo, hi, step, through=None) -> tuple[float, int]:
        """One sample's clipping error and clipped values against the grid's ends `lo`, `hi` and
        its `step` (scalars, or per channel shaped to broadcast). A value within half a step past
        an end rounds to that end, as any value inside does: clipped are the values further out.
        `through`: the function the tensor's one reader applies; the error is then taken after
        it, f(value) - f(end), nothing where the function is flat."""
        r = np.asarray(ref)
        half = np.asarray(step, np.float64) / 2
        # two comparisons and no copy for the usual tensor, which clips nothing (NaN compares False)
        clipped = (r < lo - half) | (r > hi + half)
        if not clipped.any():
            return 0.0, 0
        value = r[clipped].astype(np.float64)
        ends = [np.broadcast_to(end, r.shape)[clipped] for end in (lo, hi)]
        beyond = value - np.clip(value, *ends)
        if through is not None:
            beyond = through(value) - through(value - beyond)
        beyond = beyond[np.isfinite(beyond)]  # Inf is counted elsewhere
        return dot(beyond, beyond), beyond.size

    def add(self, terms: tuple[float, int]) -> None:
        err2, values = terms
        self.err2 += err2
        self.values += values
        self.samples += values > 0

    def result(self, agreement: Agreement, activation: Agreement | None = None) -> dict:
        """`clipped_samples`; with any clipped, the share of values clipped and the SQNR that the
        clipping alone leaves (the layer's own SQNR cannot be above it by much). With
        `activation`, the result of the table activation that alone reads the tensor (terms taken
        `through` it): that SQNR is after the function, beside the activation's own."""
        if not self.values:
            return {"clipped_samples": 0}
        judged = activation or agreement
        if self.err2 == 0:
            sqnr = 200.0
        else:
            sqnr = 10 * math.log10(judged.ref2 / self.err2) if judged.ref2 > 0 else -200.0
        row = {
            "clipped_samples": self.samples,
            "clipped_values": round(self.values / max(agreement.count, 1), 7),
        }
        if activation is None:
            return {**row, "clipping_sqnr_db": round(sqnr, 3)}
        return {
            **row,
            "clipping_after_sqnr_db": round(sqnr, 3),
            "activation_sqnr_db": activation.result()["sqnr_db"],
        }


# Clipping explains a layer's loss when its error alone is at least half the layer's squared
# error: the clipping-alone SQNR within this many dB of the layer's own
CLIPPING_EXPLAINS_DB = 10 * math.log10(2)


def clipping_figures(row: dict) -> tuple[float, float] | None:
    """(the SQNR clipping alone leaves, the SQNR it is set against) of a layer row with clipped
    values: the tensor's own, or for a tensor a lookup-table activation alone reads
    (`read_through`, fine pre-activations among them), both after that activation. Its range
    clips where the function is flat on purpose, free there; only the rest counts."""
    if row.get("op_type") in MOVE_OPS:
        return None  # a move's values are its input's, on its input's grid: the clipping entered there
    if "clipping_after_sqnr_db" in row:
        return row["clipping_after_sqnr_db"], row["activation_sqnr_db"]
    if "clipping_sqnr_db" in row and not row.get("read_through"):
        return row["clipping_sqnr_db"], row["sqnr_db"]
    return None


def clipping_explains(row: dict) -> bool:
    """Whether a layer's clipping carries at least half the squared error it is set against."""
    figures = clipping_figures(row)
    return figures is not None and figures[0] <= figures[1] + CLIPPING_EXPLAINS_DB


def clipped_layers(rows: list[dict], keep: int = 5) -> list[dict]:
    """The layers whose error is mostly clipping, lowest clipping-alone SQNR first."""
    return sorted(
        (r for r in rows if clipping_explains(r)), key=lambda r: (clipping_figures(r)[0], r["tensor"])
    )[:keep]


class Top1:
    """How often the integer model's arg-max over the class axis equals the float model's, over
    every other position (each timestep of a recogniser's [1, T, classes], each pixel of NCHW)."""

    def __init__(self, axis: int = 1) -> None:
        self.axis = axis
        self.agree = self.total = 0

    def update(self, ref: np.ndarray, cand: np.ndarray) -> None:
        ref, cand = np.asarray(ref), np.asarray(cand)
        if ref.ndim < 2 or ref.shape != cand.shape or not -ref.ndim <= self.axis < ref.ndim:
            return
        if ref.shape[self.axis] < 2:
            return
        same = np.argmax(ref, axis=self.axis) == np.argmax(cand, axis=self.axis)
        self.agree += int(same.sum())
        self.total += same.size

    def result(self) -> dict:
        return {"top1_agreement": self.agree / self.total, "top1_axis": self.axis} if self.total else {}


# ops between a Softmax and a network output that keep its last axis the last one
_KEEPS_LAST_AXIS = {"Identity", "Reshape", "Flatten", "Squeeze", "Unsqueeze"}


def class_axis(model, output: str) -> int:
    """The axis an output's classes lie on: a Softmax's axis when the output is its result (its
    last axis also through reshapes that keep the row length: PP-OCRv4 rec's [1, 40, 6625] per
    timestep), else 1 (N x classes, NCHW score maps)."""
    producers = {o: n for n in model.graph.node for o in n.output}
    shapes = recorded_shapes(model)
    name, moved = output, False
    while (node := producers.get(name)) is not None and node.op_type in _KEEPS_LAST_AXIS:
        name, moved = node.input[0], True
    if node is None or node.op_type != "Softmax":
        return 1
    rank = len(shapes.get(name, [])) or 1
    axis = next((a.i for a in node.attribute if a.name == "axis"), -1) % rank
    if not moved:
        return axis
    out_shape, in_shape = shapes.get(output, []), shapes.get(name, [])
    last = axis == rank - 1 and out_shape and in_shape and out_shape[-1] == in_shape[-1]
    return -1 if last else 1


class OpAgreement:
    """Each integer op of the golden interpreter against the QDQ model in onnxruntime, fed the same
    integer inputs (the QDQ model's codes), so differences do not compound from layer to layer."""

    def __init__(self) -> None:
        self.samples = 0
        self.by_kind: dict[str, list[int]] = {}  # kind -> [elements, within 1 LSB, exact]

    def update(self, interpreter: Interpreter, program: IntegerModel, codes: dict[str, np.ndarray]) -> None:
        self.samples += 1
        for op in program.ops:
            if op.kind in ("float", "quantize"):
                continue
            env = {i: codes[i].astype(np.int32) for i in op.inputs if i in codes}
            getattr(interpreter, f"_{op.kind}")(op, env)
            counts = self.by_kind.setdefault(op.kind, [0, 0, 0])
            for out in op.outputs:
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


# One sample with more of an output's squared error than all the others together, among at least
# this many: the output's SQNR then says more about that sample than about the quantization
DOMINANT_SHARE = 0.5
DOMINANT_MIN_SAMPLES = 8


def worst_samples(errors: list[float], sources: list[str], keep: int = 3) -> list[dict]:
    """The samples that carry most of an output's squared error (`errors`, one per sample, in
    sample order), largest first: index, where it came from and its share of the error. Empty
    when there is no error or it is not finite."""
    total = math.fsum(errors)
    if not math.isfinite(total) or total <= 0:
        return []
    order = sorted(range(len(errors)), key=lambda k: (-errors[k], k))[:keep]
    return [
        {"sample": k, "source": sources[k], "error_share": round(errors[k] / total, 4)}
        for k in order
        if errors[k] > 0
    ]


def dominant_sample_warning(output: str, worst: list[dict], samples: int) -> str | None:
    """A warning when one sample decides an output's figure (DOMINANT_SHARE)."""
    if samples < DOMINANT_MIN_SAMPLES or not worst or worst[0]["error_share"] <= DOMINANT_SHARE:
        return None
    first = worst[0]
    return (
        f"output '{output}': one of {samples} evaluation samples ({first['source']}) carries "
        f"{first['error_share']:.0%} of its squared error, so its SQNR says more about that sample "
        "than about the model"
    )
