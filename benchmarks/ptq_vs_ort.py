"""npubuild's int8 model against onnxruntime's quantize_static and NNCF on the corpus's trained
models: the example's three, the orientation classifier, PP-OCRv4 rec, the ViT saliency model
and Silero VAD (real speech, corpus/README.md; three inputs, three outputs).

    python benchmarks/ptq_vs_ort.py [--validation] [MODEL ...]

`--validation` runs the split defaults are tuned on instead: calibration crops from four of the
calibration photographs, "evaluation" crops from the other two; the evaluation photographs are not
read. The text detector's tuning split calibrates on the even crops of a scanned brochure page
and judges on the odd ones; the direction classifier's judges on 16 text lines of that brochure;
and both, with the same calibration, are judged on an old book page too (`ocr_det_book`,
`ocr_cls_book`: benchmarks/text_scans.py), and the detector on a photographed newspaper page
(`ocr_det_photo`, OpenCV's sample photograph of a Sudoku, the stand-in for the evaluation's
photographed page). Silero VAD's validation split is five of its calibration recordings
against the other three (benchmarks/speech.py, VALIDATION).

Same calibration crops (>= 32) and evaluation crops (>= 16, from other photographs) for every
tool; the text models keep the example's text images (detector: the two halves of the printed
page; direction classifier: 16 lines cut from it), calibrated with the handwriting crops and the
photo crops; the detector's calibration adds 12 crops of the scanned brochure page, and the same
detector with the same calibration is also judged on 8 crops of a scanned typewritten page
(`ocr_det_scan`), a second held-out text set.
npubuild: its own defaults (calibrate + quantize timed from the build's own action timings),
accuracy of the golden integer interpreter's outputs against the float model. onnxruntime: the
imported model (input pinned, opset >= 13, as a user would prepare it), quant_pre_process (its
symbolic shape inference needs sympy, in the `bench` extra; where it fails, pre-processing runs
again without it, and where that fails too the rows are of the unprepared model, labelled so),
then quantize_static with QDQ, per-channel int8 weights and int8
activations for MinMax, Entropy and Percentile, evaluated in onnxruntime. quantize_static passes
no bin counts to its Entropy calibrator, whose defaults (128 bins, 128 quantized bins) leave one
candidate threshold, the whole range: its Entropy row is MinMax's (equal on every row measured).
NNCF's `nncf.quantize` on the same model and images with
its performance and mixed presets (a benchmark-only dependency: `pip install -e ".[bench]"`).
Accuracy is over all evaluation images, per output: cosine and SQNR (dB) against the float
model; a model with several outputs (Silero's probability and its two LSTM states) scores the
mean over its outputs, npubuild's from accuracy.json's per-output figures alike. Each other
tool's model is scored twice, with onnxruntime's fused int8 kernels (which differ between CPUs)
and as written (graph optimizations off), and keeps the better figure (`scored`). "best other
tool" is the one with the highest SQNR. Under each row the summary gives how far the difference
can be trusted: its spread over bootstrap resamples of the evaluation images and with each image
left out (benchmarks/_resampling.py).
"""

from __future__ import annotations

import math
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import onnx
import onnxruntime as ort

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _resampling import ROUNDS, difference, shares  # noqa: E402
from _resampling import sqnr as sqnr_of  # noqa: E402
from _workspace_gen import crop_workspace  # noqa: E402

if TYPE_CHECKING:
    from npubuild.cache.store import Store

MODELS = {
    "yolo": "yolov8n",
    "ocr_det": "ppocr_det",
    "ocr_det_scan": "ppocr_det",  # the same detector judged on a scanned typewritten page
    "ocr_cls": "ppocr_cls",
    "ocr_det_book": "ppocr_det",  # tuning split only: the same models judged on an old book page
    "ocr_cls_book": "ppocr_cls",
    "ocr_det_photo": "ppocr_det",  # tuning split only: judged on a photographed newspaper page
    "orient": "orientation",  # npu_model names may not repeat the onnx_model's
    "ocr_rec": "ppocr_rec",
    "vit": "vit_focus",
    "vad": "silero_vad",
}
DATA = {
    "yolo": "yolo",
    "ocr_det": "ocr_det",
    "ocr_det_scan": "ocr_det_scan",
    "ocr_cls": "ocr_cls",
    "ocr_det_book": "ocr_det_book",
    "ocr_cls_book": "ocr_cls_book",
    "ocr_det_photo": "ocr_det_photo",
    "orient": "imagenet",
    "ocr_rec": "ocr_rec",
    "vit": "imagenet",
    "vad": "speech",
}
SHARES_ACTIONS_WITH = {
    "ocr_det_scan": "ocr_det",
    "ocr_det_book": "ocr_det",
    "ocr_cls_book": "ocr_cls",
    "ocr_det_photo": "ocr_det",
}
TUNING_ONLY = ("ocr_det_book", "ocr_cls_book", "ocr_det_photo")
EVALUATION_ONLY = ("ocr_det_scan",)  # the typewritten page is evaluation data only
CORPUS = Path(__file__).resolve().parent.parent / "corpus"


def add_corpus_models(ws: Path, validation: bool) -> None:
    """The corpus's other trained models (orientation classifier, PP-OCRv4 rec, ViT saliency,
    Silero VAD) in the crop workspace: their onnx_model blocks, preprocessing and datasets copied
    from corpus/, so the pins live in one place, and npu_models with the defaults; the image models
    on the same crops, Silero on its speech feeds (benchmarks/speech.py, as coverage.py makes them)."""
    import re

    corpus_models = (CORPUS / "models" / "BUILD").read_text()
    corpus_data = (CORPUS / "data" / "BUILD").read_text()
    models, data = [], []
    for target in ("orient", "ocr_rec", "vit", "vad"):
        source = MODELS[target]
        block = re.search(rf'onnx_model\(\n    name = "{source}",.*?\n\)\n', corpus_models, re.S)
        models += [
            block[0],
            f'npu_model(name = "{target}", model = ":{source}", '
            f'calibration = "//data:{DATA[target]}_calib", evaluation = "//data:{DATA[target]}_eval")\n',
        ]
        if any(f'"{DATA[target]}_calib"' in line for line in data):
            continue  # a data set two models share (the ImageNet-style crops)
        if DATA[target] == "speech":
            data += [line + "\n" for line in re.findall(r'dataset\(name = "speech_\w+".*\)', corpus_data)]
            continue
        preprocess = {"imagenet": "IMAGENET", "ocr_rec": "OCR_REC"}[DATA[target]]
        data += [re.search(rf"\n({preprocess} = \{{[^}}]*\}})", corpus_data)[1] + "\n"]
        for role, files in (("calib", "CALIBRATION"), ("eval", "EVALUATION")):
            data.append(
                f'dataset(name = "{DATA[target]}_{role}", srcs = {files}, preprocess = {preprocess})\n'
            )
    with open(ws / "models" / "BUILD", "a") as f:
        f.write("\n" + "\n".join(models))
    with open(ws / "data" / "BUILD", "a") as f:
        f.write("\n" + "\n".join(data))
    from coverage import speech_feeds

    speech_feeds(ws, validation)


def add_text_scans(ws: Path, validation: bool) -> dict[str, int]:
    """Printed text for the text models (benchmarks/text_scans.py). The scanned brochure's crops
    join the detector's calibration set, and `ocr_det_scan`, the same model and calibration, is
    judged on the typewritten page's crops: a second held-out text set beside the photographed
    page. The tuning split reads neither evaluation page: the detector calibrates on the even
    brochure crops and is judged on the odd ones; the direction classifier is judged on 16 text
    lines of the brochure's body (8 lines, upright and turned); and both, with the same
    calibration, are judged on an old book page too (`ocr_det_book` on its 6 crops, `ocr_cls_book`
    on 16 of its lines), a page unlike anything either calibrates on; and the detector on 9 crops
    of a photographed newspaper page (`ocr_det_photo`), the stand-in for the evaluation's
    photographed page. Returns the number of images in each new folder."""
    from _sdist import default_cache
    from text_scans import write_crops, write_lines

    build = ws / "data" / "BUILD"
    text = build.read_text()
    entry = '("ocr_det", TEXT_CALIBRATION, TEXT_EVALUATION, OCR_DET)'
    assert entry in text, "the example's data/BUILD no longer lists the detector's sets as expected"
    scans = ws / "data" / "scans"
    write_crops("linn", scans / "brochure", default_cache())
    calibration = 'TEXT_CALIBRATION + glob(["scans/brochure/*.png"])'
    if validation:
        (scans / "brochure_odd").mkdir()
        for crop in sorted((scans / "brochure").glob("*.png")):
            if int(crop.stem.rsplit("_", 1)[1]) % 2:
                crop.rename(scans / "brochure_odd" / crop.name)
        sets = f'("ocr_det", {calibration}, glob(["scans/brochure_odd/*.png"]), OCR_DET)'
        write_lines("linn", scans / "lines", default_cache())
        lines = '("ocr_cls", TEXT_CALIBRATION, TEXT_LINES, OCR_CLS)'
        assert lines in text, "the example's data/BUILD no longer lists the classifier's sets as expected"
        text = text.replace(
            lines,
            '("ocr_cls", TEXT_CALIBRATION, glob(["scans/lines/*.png"]), OCR_CLS),\n'
            '        ("ocr_cls_book", TEXT_CALIBRATION, glob(["scans/book_lines/*.png"]), OCR_CLS)',
        )
        write_crops("huck", scans / "book", default_cache())
        write_lines("huck", scans / "book_lines", default_cache())
        sets += f',\n        ("ocr_det_book", {calibration}, glob(["scans/book/*.png"]), OCR_DET)'
        write_crops("sudoku", scans / "photo", default_cache())
        sets += f',\n        ("ocr_det_photo", {calibration}, glob(["scans/photo/*.png"]), OCR_DET)'
        judged = TUNING_ONLY
    else:
        write_crops("typewriter", scans / "typewriter", default_cache())
        sets = (
            f'("ocr_det", {calibration}, TEXT_EVALUATION, OCR_DET),\n'
            f'        ("ocr_det_scan", {calibration}, glob(["scans/typewriter/*.png"]), OCR_DET)'
        )
        judged = EVALUATION_ONLY
    with open(ws / "models" / "BUILD", "a") as f:
        for name in judged:
            f.write(
                f'\nnpu_model(name = "{name}", model = ":{MODELS[name]}", '
                f'calibration = "//data:{name}_calib", evaluation = "//data:{name}_eval")\n'
            )
    build.write_text(text.replace(entry, sets))
    return {folder.name: len(list(folder.glob("*.png"))) for folder in sorted(scans.iterdir())}


def cpu() -> str:
    """The processor's name and its vector extensions onnxruntime's MLAS picks kernels by: the
    other tools' rows are computed in onnxruntime, so they can move between machines."""
    import platform

    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine()
    name = next(
        (line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")), "?"
    )
    flags = next(
        (line.split(":", 1)[1].split() for line in info.splitlines() if line.startswith("flags")), []
    )
    wanted = ("avx2", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "amx_int8")
    return f"{name}, {' '.join(f for f in wanted if f in flags) or 'none of ' + '/'.join(wanted)}"


def session(model, optimized: bool = True) -> ort.InferenceSession:
    """`optimized=False`: graph optimizations off, so a QDQ model runs as written (each op in float
    between its DequantizeLinear and QuantizeLinear) instead of as onnxruntime's fused int8 kernels."""
    options = ort.SessionOptions()
    options.log_severity_level = 3
    if not optimized:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    data = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
    return ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])


def accuracy(reference: list[list[np.ndarray]], candidate: list[list[np.ndarray]]) -> tuple[float, float]:
    """Cosine and SQNR of each output over all evaluation feeds, averaged over the outputs."""
    scores = []
    for k in range(len(reference[0])):
        r = np.concatenate([outputs[k].reshape(-1) for outputs in reference]).astype(np.float64)
        c = np.concatenate([outputs[k].reshape(-1) for outputs in candidate]).astype(np.float64)
        cos = float(r @ c / math.sqrt((r @ r) * (c @ c))) if (r @ r) * (c @ c) > 0 else 0.0
        err = float(((r - c) ** 2).sum())
        scores.append((cos, 10 * math.log10(float(r @ r) / err) if err > 0 else float("inf")))
    return float(np.mean([c for c, _ in scores])), float(np.mean([q for _, q in scores]))


class Reader:
    """onnxruntime's calibration reader over feed dicts."""

    def __init__(self, feeds: list[dict]):
        self.feeds, self.i = feeds, 0

    def get_next(self):
        if self.i >= len(self.feeds):
            return None
        self.i += 1
        return self.feeds[self.i - 1]

    def rewind(self):
        self.i = 0


def onnxruntime_rows(
    canonical: Path, calib: list[dict], evaluation: list[dict], reference: list, tmp: Path
) -> list[tuple]:
    """onnxruntime's recipe: quant_pre_process, then quantize_static with each calibration method.
    Where pre-processing fails (sympy missing; PP-OCR cls, whose shape Concat onnxruntime's
    symbolic shape inference asserts on), it is tried again without the symbolic shapes; where
    that fails too, the rows are of the unprepared model and say so in their labels, which the
    summary's "best other tool" repeats."""
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    prepared = tmp / "prepared.onnx"
    unprepared = ""
    try:
        quant_pre_process(str(canonical), str(prepared))
    except Exception as exc:  # as a user would: again without the symbolic shapes, then without
        print(f"    quant_pre_process failed ({type(exc).__name__}: {exc}); again without symbolic shapes")
        try:
            quant_pre_process(str(canonical), str(prepared), skip_symbolic_shape=True)
        except Exception as again:
            print(f"    quant_pre_process failed ({type(again).__name__}: {again}); quantizing without it")
            shutil.copy(canonical, prepared)
            unprepared = " (unprepared)"
    rows = []
    for method in (CalibrationMethod.MinMax, CalibrationMethod.Entropy, CalibrationMethod.Percentile):
        label = f"onnxruntime {method.name}{unprepared}"
        out = tmp / f"ort_{method.name}.onnx"
        start = time.perf_counter()
        try:
            quantize_static(
                str(prepared),
                str(out),
                Reader(calib),
                quant_format=QuantFormat.QDQ,
                per_channel=True,
                weight_type=QuantType.QInt8,
                activation_type=QuantType.QInt8,
                calibrate_method=method,
            )
        except Exception as exc:
            rows.append(failed(label, exc))
            continue
        rows.append(scored(label, out, start, evaluation, reference))
    return rows


def failed(label: str, exc: Exception) -> tuple:
    return (label, None, None, None, f"failed: {type(exc).__name__}: {exc}", None)


def scored(label: str, quantized, start: float, evaluation: list[dict], reference) -> tuple:
    """A tool's row: its quantized model run in onnxruntime on the evaluation feeds, twice. With
    onnxruntime's fused int8 kernels, as a deployment on this CPU computes it: MLAS picks them by
    instruction set, and without VNNI its u8s8 kernels sum pairs of products in 16 bits, which
    can saturate (onnxruntime's quantization docs), so this figure moves between machines. And
    as written (graph optimizations off: each op in float between its DequantizeLinear and
    QuantizeLinear), the QDQ model's meaning, the same on every machine. The row's figure is the
    better of the two (by SQNR), so the bar is at least as hard as either; the note gives both."""
    seconds = time.perf_counter() - start
    figures = []
    for optimized in (True, False):
        q = session(quantized, optimized)
        outputs = [q.run(None, feed) for feed in evaluation]
        figures.append((*accuracy(reference, outputs), shares(reference, outputs)))
    (kcos, ksqnr, _), (rcos, rsqnr, _) = figures
    cos, sqnr, parts = max(figures, key=lambda f: f[1])
    note = f"int8 kernels {kcos:.4f} / {ksqnr:.2f}, as written {rcos:.4f} / {rsqnr:.2f}"
    return (label, cos, sqnr, seconds, note, parts)


def nncf_rows(canonical: Path, calib: list[dict], evaluation: list[dict], reference: list) -> list[tuple]:
    """NNCF's post-training quantization of the same ONNX model on the same calibration images,
    both presets (performance: symmetric activations; mixed: asymmetric), evaluated in
    onnxruntime. NNCF is a benchmark-only dependency (`pip install -e ".[bench]"`)."""
    try:
        import nncf
    except ImportError:
        return [("NNCF", None, None, None, 'not installed: pip install -e ".[bench]"', None)]
    model = onnx.load(canonical)
    dataset = nncf.Dataset(calib)
    rows = []
    for preset in (nncf.QuantizationPreset.PERFORMANCE, nncf.QuantizationPreset.MIXED):
        start = time.perf_counter()
        try:
            quantized = nncf.quantize(model, dataset, preset=preset, subset_size=len(calib))
        except Exception as exc:
            rows.append(failed(f"NNCF {preset.value}", exc))
            continue
        rows.append(scored(f"NNCF {preset.value}", quantized, start, evaluation, reference))
    return rows


def golden_shares(
    out: Path, canonical: onnx.ModelProto, evaluation: list[dict], reference: list
) -> np.ndarray:
    """npubuild's row per image (_resampling.shares): its golden integer interpreter, the program
    evaluate scores, run again here on the same feeds against the same reference as the others."""
    from npubuild.intmodel.interpreter import load_integer_model

    _, _, interpreter = load_integer_model(out / "quantized.npq")
    names = [o.name for o in canonical.graph.output]
    ours = []
    for feed in evaluation:
        outputs = interpreter.run(feed)[0]
        ours.append([outputs[n] for n in names])
    return shares(reference, ours)


def every_tool(
    ws: Path, store: Store, target: str, ours_seconds: float, tmp: Path
) -> tuple[int, int, list[tuple]]:
    """The rows of one built npu_model: npubuild's (from its accuracy.json, recomputed per image
    from its golden interpreter), then onnxruntime's and NNCF's on the same calibration and
    evaluation feeds. Returns the two sets' sizes and the rows, npubuild's first."""
    import json

    from npubuild.engine.run import build
    from npubuild.stages.feeds import samples_for

    out = ws / "npubuild-out" / "models" / target
    report = json.loads((out / "accuracy.json").read_text())
    outputs = list(report["outputs"].values())  # the mean over outputs, as accuracy()
    cosine = float(np.mean([o["cosine"] for o in outputs]))
    sqnr = float(np.mean([o["sqnr_db"] for o in outputs]))
    # the other tools calibrate on the data sets' tensors, which a model's build does not write
    # out; built every time, so a changed set is never read stale (files in place are kept)
    built = build(ws, store, [f"//data:{DATA[target]}_calib", f"//data:{DATA[target]}_eval"], jobs=1)
    assert built.ok, built.errors
    sets = ws / "npubuild-out" / "data"
    canonical = onnx.load(out / "canonical.onnx")
    calib, evaluation = (
        samples_for(canonical, np.load(sets / f"{DATA[target]}_{role}" / "tensors.npy"), 10**6)
        for role in ("calib", "eval")
    )
    # the float model's outputs, every tool's reference
    float_model = session(canonical)
    reference = [float_model.run(None, feed) for feed in evaluation]
    parts = golden_shares(out, canonical, evaluation, reference)
    again = float(sqnr_of(parts, np.ones((1, parts.shape[2])))[0])
    note = f"(recomputed here: {again:.2f})" if abs(again - sqnr) > 0.05 else ""
    rows = [("npubuild default", cosine, sqnr, ours_seconds, note, parts)]
    tmp.mkdir()
    rows += onnxruntime_rows(out / "canonical.onnx", calib, evaluation, reference, tmp)
    rows += nncf_rows(out / "canonical.onnx", calib, evaluation, reference)
    return len(calib), len(evaluation), rows


def best_other(rows: list[tuple]) -> tuple | None:
    """The other tool with the highest SQNR (rows[0] is npubuild's), None if every one failed."""
    others = [r for r in rows[1:] if r[1] is not None]
    return max(others, key=lambda r: r[2]) if others else None


def main() -> None:
    import argparse
    import logging

    parser = argparse.ArgumentParser()
    parser.add_argument("--validation", action="store_true", help="the tuning split (see the docstring)")
    parser.add_argument("models", nargs="*", choices=[[], *MODELS], help="default: all")
    args = parser.parse_args()
    elsewhere = EVALUATION_ONLY if args.validation else TUNING_ONLY
    models = {m: MODELS[m] for m in (args.models or MODELS) if m not in elsewhere}

    logging.getLogger().setLevel(logging.ERROR)  # onnxruntime.quantization warns per tensor
    from npubuild.cache.store import Store
    from npubuild.engine.run import build

    tmp = Path(tempfile.mkdtemp(prefix="npubuild-ptq-"))
    try:
        ws = tmp / "ws"
        n_calib, n_eval = crop_workspace(ws, validation=args.validation)
        add_corpus_models(ws, args.validation)
        if {"ocr_det", "ocr_cls", *SHARES_ACTIONS_WITH} & set(models):
            print(f"text models, images from printed pages: {add_text_scans(ws, args.validation)}")
        print(f"calibration crops: {n_calib}, evaluation crops: {n_eval} (from disjoint photographs)")
        from importlib.metadata import PackageNotFoundError, version

        def installed(package: str) -> str:
            try:
                return version(package)
            except PackageNotFoundError:
                return "not installed"

        print(
            f"onnxruntime {installed('onnxruntime')}, NNCF {installed('nncf')}"
            " (the other tools' figures move with them); Pillow "
            f"{installed('pillow')}, numpy {installed('numpy')}, onnx {installed('onnx')} (every"
            " tool's inputs: the photographs' decoding and resizing, the imported model)"
        )
        print(f"CPU: {cpu()} (onnxruntime's int8 and float kernels are chosen by instruction set)")
        store = Store(tmp / "cache")
        outcome = build(ws, store, [f"//models:{m}" for m in models], jobs=2)
        assert outcome.ok, outcome.errors
        seconds = {(a.stage, a.owner): outcome.result(a).seconds for a in outcome.actions}
        summary = []
        for target, source in models.items():
            # built together, ocr_det_scan's calibrate and quantize are ocr_det's (same inputs)
            owner = f"//models:{target}"
            if ("calibrate", owner) not in seconds:
                owner = f"//models:{SHARES_ACTIONS_WITH[target]}"
            ours = seconds[("calibrate", owner)] + seconds[("quantize", owner)]
            calib, evaluation, rows = every_tool(ws, store, target, ours, tmp / target)
            print(f"\n{target} ({source}): {calib} calibration, {evaluation} evaluation images")
            print(f"  {'':<36} {'cosine':>8} {'SQNR dB':>8} {'time s':>7}")
            for label, cos, sqnr, t, note, _ in rows:
                if cos is None:
                    print(f"  {label:<36} {note}")
                else:
                    print(f"  {label:<36} {cos:>8.4f} {sqnr:>8.2f} {t:>7.2f} {note}")
            best = best_other(rows)
            percentile = [r for r in rows[1:] if r[0].startswith("onnxruntime Percentile")]
            pct = next((r for r in percentile if r[1] is not None), None)
            spread = difference(rows[0][5], best[5]) if best else None
            summary.append((target, rows[0], best, pct, spread))
        print("\nsummary")
        for target, ours, best, pct, spread in summary:
            verdict = "yes" if best is None or (ours[1] >= best[1] and ours[2] >= best[2]) else "no"
            ratio = f"{ours[3] / pct[3]:.2f}" if pct else "n/a"
            print(
                f"  {target:<8} npubuild cos {ours[1]:.4f} / {ours[2]:.2f} dB; best other tool "
                f"{best[0] if best else '-'} cos {best[1] if best else float('nan'):.4f} / "
                f"{best[2] if best else float('nan'):.2f} dB; at least as good: {verdict}; "
                f"time npubuild/onnxruntime-Percentile: {ratio}"
            )
            if spread:
                print(
                    f"           SQNR difference {spread['all']:+.2f} dB; over {ROUNDS} resamples of its "
                    f"images 5%-95% [{spread['p5']:+.2f}, {spread['p95']:+.2f}], at least as good in "
                    f"{spread['share']:.0%}; one image left out [{spread['least_left_out']:+.2f}, "
                    f"{spread['most_left_out']:+.2f}]"
                )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
