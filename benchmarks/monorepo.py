"""A monorepo of npu_model targets (the three real models x both built-in targets x five
quantization settings = 30), built four ways in one run:

    python benchmarks/monorepo.py [--per-model 10]

1. cold, `--jobs 1`, empty local cache;
2. cold, `--jobs 2`, another empty local cache;
3. no-op: the second cache again (median of 3);
4. publish: the second cache with `--remote-cache` (a real nginx WebDAV on loopback): every local
   result missing from the remote is written there, nothing runs;
5. remote-warm: a third, empty local cache with `--remote-cache`: every result is downloaded.

Prints time and actions executed for each, and the remote-warm time as a share of each cold build
(goal: zero actions, <= 10 %). Outputs of the remote-warm build are compared byte for byte with the
cold build's.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "tests")]
from _workspace_gen import generate  # noqa: E402
from webdav import WebDavCache  # noqa: E402


def build(ws: Path, cache: Path, *args: str) -> tuple[float, int, int, str]:
    """(seconds, actions executed, actions in the graph, last line) of one CLI build."""
    env = {**os.environ, "NPUBUILD_CACHE": str(cache), "COLUMNS": "200"}
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "npubuild", "build", "//...", *args],
        cwd=ws,
        env=env,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
    )
    seconds = time.perf_counter() - start
    last = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    if proc.returncode != 0:
        sys.exit(f"build failed ({proc.returncode}): {last}\n{proc.stderr[-3000:]}")
    total = int(re.search(r"(\d+) actions", last).group(1))
    ran = re.search(r"(\d+) ran", last)
    return seconds, int(ran.group(1)) if ran else 0, total, last


def outputs(ws: Path) -> dict[str, str]:
    out = ws / "npubuild-out"
    return {
        str(p.relative_to(out)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(out.rglob("*"))
        if p.is_file()
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--per-model", type=int, default=10)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="npubuild-monorepo-"))
    try:
        ws = tmp / "ws"
        count = generate(ws, args.per_model)
        print(f"workspace: {count} npu_model targets (3 models x 2 targets x 5 settings)", flush=True)
        rows = []
        with WebDavCache(tmp / "nginx") as dav:
            cold1 = build(ws, tmp / "cache-1", "--jobs", "1")
            rows.append(("cold, --jobs 1", *cold1[:3]))
            print(f"  {rows[-1]}", flush=True)
            reference = outputs(ws)
            shutil.rmtree(ws / "npubuild-out")
            cold2 = build(ws, tmp / "cache-2", "--jobs", "2")
            rows.append(("cold, --jobs 2", *cold2[:3]))
            print(f"  {rows[-1]}", flush=True)
            noops = [build(ws, tmp / "cache-2", "--jobs", "2") for _ in range(3)]
            rows.append(
                ("no-op (median of 3)", statistics.median(n[0] for n in noops), noops[-1][1], noops[-1][2])
            )
            publish = build(ws, tmp / "cache-2", "--jobs", "2", "--remote-cache", dav.url)
            rows.append(("publish to the remote", *publish[:3]))
            entries = len(dav.entries("ac")), len(dav.entries("cas"))
            shutil.rmtree(ws / "npubuild-out")
            warm = build(ws, tmp / "cache-3", "--jobs", "2", "--remote-cache", dav.url)
            rows.append(("clean cache, remote-warm", *warm[:3]))
            identical = outputs(ws) == reference
        print()
        print("| build | seconds | actions executed | actions |")
        print("|---|---|---|---|")
        for name, seconds, ran, total in rows:
            print(f"| {name} | {seconds:.2f} | {ran} | {total} |")
        print()
        print(f"remote cache after publishing: {entries[0]} action entries, {entries[1]} blobs")
        print(f"remote-warm build: {warm[3]}")
        print(
            f"remote-warm outputs byte-identical to the cold --jobs 1 build: {'yes' if identical else 'NO'}"
        )
        print(f"cold --jobs 1 / --jobs 2 speed-up: {cold1[0] / cold2[0]:.2f}x")
        for name, cold in (("--jobs 1", cold1), ("--jobs 2", cold2)):
            share = warm[0] / cold[0]
            print(f"remote-warm / cold {name}: {share:.1%} (goal <= 10 %; zero actions: {warm[1] == 0})")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
