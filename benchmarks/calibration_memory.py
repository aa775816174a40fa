"""Peak memory of the calibrate stage for 16 and for 128 calibration images of YOLOv8n (320x320).

    python benchmarks/calibration_memory.py

Each run is a fresh process (ru_maxrss of that process only); the images are crops of the
committed photographs. Streaming statistics: the two peaks should be about equal.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _workspace_gen import crop_workspace  # noqa: E402

CHILD = """
import json, resource, sys, time
from pathlib import Path
from npubuild.stages import calibrate
start = time.perf_counter()
out = Path(sys.argv[3]); out.mkdir()
calibrate.run({}, {"model": Path(sys.argv[1]), "calibration": Path(sys.argv[2])}, out)
print(json.dumps({"peak_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                  "seconds": time.perf_counter() - start}))
"""


def main() -> None:
    from npubuild.cache.store import Store
    from npubuild.engine.run import build

    tmp = Path(tempfile.mkdtemp(prefix="npubuild-calmem-"))
    try:
        ws = tmp / "ws"
        crop_workspace(ws, per_calibration_photo=22, per_evaluation_photo=1)
        build_file = ws / "data" / "BUILD"
        text = build_file.read_text()
        text += (
            '\ndataset(name = "crops16", srcs = glob(["crops/calib/*.png"]), preprocess = YOLO, limit = 16)\n'
        )
        text += (
            'dataset(name = "crops128", srcs = glob(["crops/calib/*.png"]), preprocess = YOLO, limit = 128)\n'
        )
        build_file.write_text(text)
        store = Store(tmp / "cache")
        outcome = build(ws, store, ["//models:yolo", "//data:crops16", "//data:crops128"], until="optimize")
        assert outcome.ok, outcome.errors
        model = ws / "npubuild-out" / "models" / "yolo" / "optimized.onnx"
        for n in (16, 128):
            tensors = ws / "npubuild-out" / "data" / f"crops{n}" / "tensors.npy"
            proc = subprocess.run(
                [sys.executable, "-c", CHILD, str(model), str(tensors), str(tmp / f"out{n}")],
                capture_output=True,
                text=True,
                check=True,
            )
            result = json.loads(proc.stdout.strip().splitlines()[-1])
            size = tensors.stat().st_size / 2**20
            print(
                f"{n:>4} images ({size:.0f} MiB of tensors): peak RSS {result['peak_kib'] / 1024:.0f} MiB, "
                f"{result['seconds']:.1f} s"
            )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
