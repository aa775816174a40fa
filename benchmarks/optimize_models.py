"""Node counts before and after optimize, and how far the optimized model's outputs are from the
original model's in onnxruntime, for the three real models on the example's real photographs.

    python benchmarks/optimize_models.py

The original model is the file from the pinned wheel with only its input shape pinned (so that
onnxruntime can run it on the same tensors); the candidate is npubuild's optimized.onnx.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _workspace_gen import copy_example_unfused  # noqa: E402

MODELS = {  # npu_model -> (onnx_model, evaluation and calibration data sets)
    "yolo": ("yolov8n", ["yolo_calib", "yolo_eval"]),
    "ocr_det": ("ppocr_det", ["ocr_det_calib", "ocr_det_eval"]),
    "ocr_cls": ("ppocr_cls", ["ocr_cls_calib", "ocr_cls_eval"]),
}


def session(model: onnx.ModelProto) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def original_with_pinned_input(path: Path, shape: list[int]) -> onnx.ModelProto:
    model = onnx.load(path)
    dims = model.graph.input[0].type.tensor_type.shape.dim
    for d, v in zip(dims, shape):
        d.Clear()
        d.dim_value = v
    return model


def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="npubuild-optbench-"))
    try:
        ws = tmp / "ws"
        copy_example_unfused(ws)  # the models take the data sets' float tensors
        env = {**os.environ, "NPUBUILD_CACHE": str(tmp / "cache")}
        subprocess.run(
            [sys.executable, "-m", "npubuild", "build", "//..."],
            cwd=ws,
            env=env,
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        print(
            f"{'model':<10} {'nodes before':>12} {'after':>6} {'photos':>6} "
            f"{'max |diff|':>11} {'max |ref|':>10}"
        )
        for name, (source, datasets) in MODELS.items():
            out = ws / "npubuild-out" / "models" / name
            canonical = onnx.load(out / "canonical.onnx")
            shape = [d.dim_value for d in canonical.graph.input[0].type.tensor_type.shape.dim]
            raw = _fetched_original(tmp / "cache", ws, source)
            original = original_with_pinned_input(raw, shape)
            optimized = onnx.load(out / "optimized.onnx")
            tensors = np.concatenate(
                [np.load(ws / "npubuild-out" / "data" / d / "tensors.npy") for d in datasets]
            )
            ref, opt = session(original), session(optimized)
            worst, scale = 0.0, 0.0
            for sample in tensors:
                feed = {ref.get_inputs()[0].name: sample[None]}
                for a, b in zip(ref.run(None, feed), opt.run(None, {opt.get_inputs()[0].name: sample[None]})):
                    worst = max(worst, float(np.max(np.abs(a.astype(np.float64) - b))))
                    scale = max(scale, float(np.max(np.abs(a))))
            print(
                f"{name:<10} {len(original.graph.node):>12} {len(optimized.graph.node):>6} {len(tensors):>6} "
                f"{worst:>11.3g} {scale:>10.3g}"
            )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _fetched_original(cache: Path, ws: Path, source: str) -> Path:
    """The model file exactly as the wheel holds it, read back from npubuild's store."""
    from npubuild.cache.store import Store
    from npubuild.engine.analysis import analyse

    store = Store(cache)
    plans, _ = analyse(ws, store, ["//..."], None)
    (plan,) = [p for p in plans if p.label.name == source]
    (fetch,) = [a for step, a in plan.steps if step == "fetch"]
    entry = store.get_action(fetch.key({}))
    dest = cache.parent / f"{source}.onnx"
    store.copy_to(entry["outputs"]["model"], dest)
    return dest


if __name__ == "__main__":
    main()
