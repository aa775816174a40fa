"""A pre-quantized model end to end: YOLOv8n made a QDQ model by onnxruntime's quantize_static
(per-channel int8 weights, int8 activations, calibrated on the corpus's calibration photographs),
then compiled by npubuild with no calibration set. Prints whether a calibrate stage ran, the NPU
share, and the cosine between our integer model (the golden interpreter) and the QDQ model run in
onnxruntime on the evaluation photographs (issue 15's bar: >= 0.999), and of each against the
float model.

    python benchmarks/prequantized.py [--workspace DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from coverage import assemble  # noqa: E402

QDQ_TARGETS = """
onnx_model(
    name = "yolo_qdq",
    src = "yolo_qdq.onnx",
    input_shapes = {"images": [1, 3, 320, 320]},
)

npu_model(
    name = "yolo_qdq_m",
    model = ":yolo_qdq",
    evaluation = "//data:yolo_eval",
    target = "vnpu-m",
)
"""


def build(ws: Path, *labels: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "npubuild", "build", *labels, "-j", str(os.cpu_count() or 1)],
        cwd=ws,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        sys.exit(f"build of {' '.join(labels)} failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.reshape(-1).astype(np.float64), b.reshape(-1).astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def ort_qdq(float_path: Path, qdq_path: Path, samples: np.ndarray, input_name: str, unsigned=False) -> None:
    """onnxruntime's quantize_static in QDQ format: per-channel int8 weights, int8 (or uint8)
    activations calibrated on `samples` ([N, ...], one sample per feed)."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.feeds = iter([{input_name: s[None]} for s in samples])

        def get_next(self):
            return next(self.feeds, None)

    quantize_static(
        str(float_path),
        str(qdq_path),
        Reader(),
        quant_format=QuantFormat.QDQ,
        per_channel=True,
        activation_type=QuantType.QUInt8 if unsigned else QuantType.QInt8,
        weight_type=QuantType.QInt8,
    )


def main() -> int:
    import onnxruntime as ort

    from npubuild.intmodel.interpreter import load_integer_model

    parser = argparse.ArgumentParser()
    parser.add_argument("--workspace", type=Path)
    args = parser.parse_args()
    ws = assemble(args.workspace or Path(tempfile.mkdtemp(prefix="npubuild-qdq-")))
    build(ws, "//models:yolov8n", "//data:yolo_calib", "//data:yolo_eval")
    out = ws / "npubuild-out"
    float_model = out / "models" / "yolov8n" / "canonical.onnx"
    calib = np.load(out / "data" / "yolo_calib" / "tensors.npy")
    evaluation = np.load(out / "data" / "yolo_eval" / "tensors.npy")

    qdq_path = ws / "models" / "yolo_qdq.onnx"
    ort_qdq(float_model, qdq_path, calib, "images")
    with open(ws / "models" / "BUILD", "a") as f:
        f.write(QDQ_TARGETS)
    build(ws, "//models:yolo_qdq_m")
    result = out / "models" / "yolo_qdq_m"
    plan = json.loads((result / "partition.json").read_text())
    quantize = json.loads((result / "quantize.json").read_text())
    _, _, interpreter = load_integer_model(result / "quantized.npq")
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    qdq = ort.InferenceSession(str(qdq_path), options, providers=["CPUExecutionProvider"])
    fp = ort.InferenceSession(str(float_model), options, providers=["CPUExecutionProvider"])
    ours_vs_qdq, ours_vs_float, qdq_vs_float = [], [], []
    for sample in evaluation:
        feed = {"images": sample[None]}
        ours, _ = interpreter.run(feed)
        (ref,) = qdq.run(None, feed)
        (flt,) = fp.run(None, feed)
        (got,) = ours.values()
        ours_vs_qdq.append(cosine(got, ref))
        ours_vs_float.append(cosine(got, flt))
        qdq_vs_float.append(cosine(ref, flt))
    print(f"calibrate stage ran: {(result / 'calibrate.json').exists()}")
    warned = [w for w in quantize["warnings"] if "no calibration statistics" in w]
    print(f"tensors without a grid in the QDQ model: {len(warned)}")
    print(
        f"ops on the NPU: {plan['npu_ops']}, CPU fallbacks: {len(plan['fallbacks'])}, "
        f"transitions: {plan['transitions']}"
    )
    print(
        f"integer model vs onnxruntime QDQ model: min cosine {min(ours_vs_qdq):.5f} "
        f"over {len(evaluation)} photos"
    )
    print(f"integer model vs float model:           min cosine {min(ours_vs_float):.5f}")
    print(f"onnxruntime QDQ model vs float model:   min cosine {min(qdq_vs_float):.5f}")
    return 0 if min(ours_vs_qdq) >= 0.999 else 1


if __name__ == "__main__":
    raise SystemExit(main())
