"""No-op rebuild of a generated 12-target workspace against the floor of importing the CLI's
own dependencies (`python -c "import typer, rich, pydantic, diskcache"`), both timed in this run.

    python benchmarks/noop.py [--repeat 9]

Prints the medians and their ratio (goal: <= 1.5).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _workspace_gen import generate  # noqa: E402

FLOOR = [sys.executable, "-c", "import typer, rich, pydantic, diskcache"]


def timed(cmd: list[str], cwd: Path, env: dict) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, cwd=cwd, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=9)
    parser.add_argument("--per-model", type=int, default=4)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="npubuild-noop-"))
    try:
        ws = tmp / "ws"
        count = generate(ws, args.per_model)
        env = {**os.environ, "NPUBUILD_CACHE": str(tmp / "cache")}
        build = [sys.executable, "-m", "npubuild", "build", "//...", "--jobs", "2"]
        cold = timed(build, ws, env)
        print(f"workspace: {count} npu_model targets; cold build {cold:.1f}s")
        timed(build, ws, env)  # settle the stat cache once (files written seconds ago are re-hashed)
        noop, floor = [], []
        for _ in range(args.repeat):  # interleaved, so machine noise hits both alike
            floor.append(timed(FLOOR, ws, env))
            noop.append(timed(build, ws, env))
        check = subprocess.run(build, cwd=ws, env=env, capture_output=True, text=True, check=True)
        last = check.stdout.strip().splitlines()[-1]
        f, n = statistics.median(floor), statistics.median(noop)
        print(f"no-op build: {last}")
        print(f"floor (import typer, rich, pydantic, diskcache): median {f * 1000:.0f} ms")
        print(f"no-op build of //...:                            median {n * 1000:.0f} ms")
        print(f"ratio no-op / floor: {n / f:.2f}  (goal <= 1.5)")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
