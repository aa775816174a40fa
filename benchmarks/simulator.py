"""Per-image time of the NPU simulator on YOLOv8n against onnxruntime running the float model.

    python benchmarks/simulator.py

Builds YOLOv8n for both built-in targets (the example workspace's data), then times, on the same
images (the example's evaluation and calibration photos, 9) and in the same run: onnxruntime on the
imported float model one image at a time (as a user runs it, every graph rewrite and its default
threads: the ratio's baseline; and as npubuild's stages run it, one thread and no rewrites: after
the slash), and `model.npub` end to end (NPU subgraphs in the instruction-level simulator, CPU
subgraphs in onnxruntime) two ways: one image at a time, and as the simulate stage runs it (the
images in even batches of at most stages/simulate.batch_size; one batch with its convolutions on
every core, several on a thread each: stages/simulate.batch_plan), per image. Each after one
warm-up. Prints the ratios (issue 17's bar: <= 5x). The baseline is timed once, before the
simulator's rows, so a change in the machine's speed during the run moves the ratios; the last
line of each target pairs every batch run with an onnxruntime pass over the same images just
before it (the median of PAIRED_ROUNDS such ratios, and their range).
"""

from __future__ import annotations

import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _workspace_gen import copy_example_unfused, median_seconds, onnxruntime_baselines  # noqa: E402

ROUNDS = 3
PAIRED_ROUNDS = 5


def main() -> None:
    from npubuild.cache.store import Store
    from npubuild.engine.run import build
    from npubuild.stages.parallel import in_order, sample_workers
    from npubuild.stages.prepare import _image
    from npubuild.stages.simulate import Runtimes, batch_plan, batch_size
    from npubuild.targets.runtime import Runtime, load

    tmp = Path(tempfile.mkdtemp(prefix="npubuild-sim-"))
    try:
        ws = tmp / "ws"
        copy_example_unfused(ws)  # the binary takes the float tensors onnxruntime is timed on
        models = ws / "models" / "BUILD"
        models.write_text(
            models.read_text()
            + '\nnpu_model(name = "yolo_s", model = ":yolov8n", calibration = "//data:yolo_calib",\n'
            + '          evaluation = "//data:yolo_eval", target = "vnpu-s")\n'
        )
        store = Store(tmp / "cache")
        outcome = build(ws, store, ["//models:yolo", "//models:yolo_s"], jobs=2)
        assert outcome.ok, outcome.errors
        out = ws / "npubuild-out" / "models"
        pp = {"resize": [320, 320], "color": "RGB", "scale": 1 / 255, "mean": [0.0], "std": [1.0]}
        pp.update(dtype="float32", layout="NCHW")
        photos = sorted(
            p
            for kind in ("eval", "calib")
            for p in (ws / "data" / "photos" / kind).iterdir()
            if p.suffix in (".jpg", ".png")
        )
        images = [_image(p, p.name, pp)[None] for p in photos]
        baselines = onnxruntime_baselines(out / "yolo" / "canonical.onnx")
        name = baselines["default"].get_inputs()[0].name
        ort_s, ref_s = (
            median_seconds(lambda x, s=baselines[kind]: s.run(None, {name: x}), images, ROUNDS)
            for kind in ("default", "reference")
        )
        print(f"YOLOv8n, {len(images)} images x {ROUNDS} rounds, median per image")
        print(f"  onnxruntime float model, default session:   {ort_s * 1000:8.1f} ms")
        print(f"  onnxruntime float model, reference session: {ref_s * 1000:8.1f} ms")
        for label, target in (("yolo", "vnpu-m"), ("yolo_s", "vnpu-s")):
            runtime = Runtime(load(out / label / "model.npub"))
            sim_s = median_seconds(lambda x, r=runtime: r.run({name: x}), images, ROUNDS)
            print(
                f"  simulator, {target}, one image at a time:   {sim_s * 1000:8.1f} ms   "
                f"ratio {sim_s / ort_s:5.1f}x / {sim_s / ref_s:4.1f}x"
            )
            size, workers = batch_size(runtime.sim.sram.size, runtime.sim.dram.size), sample_workers()
            sizes, threads = batch_plan(len(images), size, workers)
            runtimes = Runtimes(load(out / label / "model.npub"), max(sizes), threads)
            starts = np.cumsum([0, *sizes])
            batches = [[{name: x} for x in images[a:b]] for a, b in zip(starts[:-1], starts[1:])]

            def run_batch(batch, rs=runtimes):
                with rs.lend() as runtime:
                    return runtime.run_batch(batch)

            def all_batches(_, bs=batches, n=workers, run=run_batch):
                return list(in_order(run, bs, n))

            whole = median_seconds(all_batches, [None], ROUNDS)
            stage_s = whole / len(images)
            print(
                f"  simulator, {target}, as the stage runs it:  {stage_s * 1000:8.1f} ms   "
                f"ratio {stage_s / ort_s:5.1f}x / {stage_s / ref_s:4.1f}x (bar <= 5x; batches "
                f"{sizes} on {min(workers, len(sizes))} thread(s), onnxruntime at {threads} each)"
            )
            # the same, each round's simulation right after its own onnxruntime pass: the
            # machine's speed drifts over a run, and a baseline timed minutes earlier carries it
            ratios = []
            for _ in range(PAIRED_ROUNDS):
                ort_round = median_seconds(lambda x: baselines["default"].run(None, {name: x}), images, 1)
                started = time.perf_counter()
                all_batches(None)
                ratios.append((time.perf_counter() - started) / len(images) / ort_round)
            print(
                f"  the same against the onnxruntime pass just before it, {PAIRED_ROUNDS} rounds: "
                f"median {statistics.median(ratios):.2f}x ({min(ratios):.2f}x-{max(ratios):.2f}x)"
            )
        store.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
