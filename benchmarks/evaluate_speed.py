"""Golden interpreter time per image against onnxruntime running the float model, on three
detectors: YOLOv8n (320x320), PP-OCRv4 det (320x320, as the example now
declares it; 480x480 before 2026-11-23) and YOLOv8n pinned at 640x640.

    python benchmarks/evaluate_speed.py

Builds the three npu_models from the example workspace's photos, then times, in the same run and
on the same evaluation images (each after one warm-up):
- onnxruntime on the imported float model, one image at a time, twice: as a user runs it (every
  graph rewrite, its default threads: the ratios' baseline) and as npubuild's stages run it (one
  thread, no rewrites: the "ref" columns);
- the golden interpreter one image at a time (what one sample costs);
- the golden interpreter as the evaluate stage runs it: samples in threads (stages/parallel.py,
  BLAS at one thread each), time for all the images, the median of ROUNDS passes, per image
  (what a user waits for per image);
- the evaluate stage's own wall time from the build, per image (it also runs the float and QDQ
  models with every layer exposed and compares every layer).
Prints each as a ratio to onnxruntime's default session (issue 17's bar: the golden interpreter
<= 5x) and, after the slash, to the one-thread reference session.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _workspace_gen import copy_example_unfused, median_seconds, onnxruntime_baselines  # noqa: E402

ROUNDS = 3
EXTRA = """
onnx_model(
    name = "yolov8n_640",
    src = pypi_file(
        package = "nudenet",
        version = "3.4.2",
        path = "nudenet/320n.onnx",
        sha256 = "c15d8273adad2d0a92f014cc69ab2d6c311a06777a55545f2c4eb46f51911f0f",
    ),
    input_shapes = {"images": [1, 3, 640, 640]},
)

npu_model(name = "yolo640", model = ":yolov8n_640", calibration = "//data:yolo640_calib",
          evaluation = "//data:yolo640_eval")
"""
EXTRA_DATA = """
YOLO640 = {"resize": [640, 640], "color": "RGB", "scale": 1 / 255}
dataset(name = "yolo640_calib", srcs = CALIBRATION, preprocess = YOLO640)
dataset(name = "yolo640_eval", srcs = EVALUATION, preprocess = YOLO640)
"""
MODELS = {"yolo": "yolo_eval", "ocr_det": "ocr_det_eval", "yolo640": "yolo640_eval"}


def main() -> None:
    import numpy as np
    import onnx

    from npubuild.cache.store import Store
    from npubuild.engine.run import build
    from npubuild.intmodel.interpreter import load_integer_model
    from npubuild.stages.feeds import samples_for
    from npubuild.stages.parallel import in_order, sample_workers

    tmp = Path(tempfile.mkdtemp(prefix="npubuild-evalspeed-"))
    try:
        ws = tmp / "ws"
        copy_example_unfused(ws)  # the models take the data sets' float tensors
        with open(ws / "models" / "BUILD", "a") as f:
            f.write(EXTRA)
        with open(ws / "data" / "BUILD", "a") as f:
            f.write(EXTRA_DATA)
        store = Store(tmp / "cache")
        labels = [f"//models:{m}" for m in MODELS] + [f"//data:{d}" for d in MODELS.values()]
        outcome = build(ws, store, labels, jobs=2)
        assert outcome.ok, outcome.errors
        stage_seconds = {(a.stage, a.owner): outcome.result(a).seconds for a in outcome.actions}
        workers = sample_workers()
        print(f"golden interpreter vs onnxruntime float, per image; {workers} sample threads")
        print(
            f"  {'model':<9} {'images':>6} {'ORT ms':>7} {'ref ms':>7} {'golden 1 ms':>12} {'ratio':>11} "
            f"{'golden stage ms':>16} {'ratio':>11} {'evaluate ms':>12} {'ratio':>11}"
        )
        for label, data in MODELS.items():
            out = ws / "npubuild-out" / "models" / label
            model = onnx.load(out / "optimized.onnx")
            tensors = np.load(ws / "npubuild-out" / "data" / data / "tensors.npy")
            feeds = samples_for(model, tensors, len(tensors))
            baselines = onnxruntime_baselines(out / "canonical.onnx")
            _, _, interpreter = load_integer_model(out / "quantized.npq")

            ort_s = median_seconds(partial(baselines["default"].run, None), feeds, ROUNDS)
            ref_s = median_seconds(partial(baselines["reference"].run, None), feeds, ROUNDS)
            golden_s = median_seconds(interpreter.run, feeds, ROUNDS)

            def stage(_, run=interpreter.run, fs=feeds):
                for _ in in_order(run, fs, workers):
                    pass

            stage_s = median_seconds(stage, [None], ROUNDS) / len(feeds)
            evaluate_s = stage_seconds[("evaluate", f"//models:{label}")] / len(feeds)

            def ratios(seconds: float, ort_s: float = ort_s, ref_s: float = ref_s) -> str:
                return f"{seconds / ort_s:5.1f}x/{seconds / ref_s:4.1f}x"

            print(
                f"  {label:<9} {len(feeds):>6} {ort_s * 1e3:>7.1f} {ref_s * 1e3:>7.1f} "
                f"{golden_s * 1e3:>12.1f} {ratios(golden_s)} {stage_s * 1e3:>16.1f} {ratios(stage_s)} "
                f"{evaluate_s * 1e3:>12.1f} {ratios(evaluate_s)}"
            )
        store.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
