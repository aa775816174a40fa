"""A build's worker processes live only as long as the build; Ctrl-C is quiet and exits 130."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from conftest import cli, cli_build


def _children(pid: int) -> set[int]:
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.add(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        state = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _start_build(ws: Path, cache: Path, temp: Path | None = None) -> tuple[subprocess.Popen, set[int]]:
    proc = cli_build(ws, cache, "-j", "2", new_session=True, env={"TMPDIR": str(temp)} if temp else None)
    deadline = time.monotonic() + 60
    workers: set[int] = set()
    while time.monotonic() < deadline and len(workers) < 2:
        workers = {c for c in _children(proc.pid) if "spawn_main" in _cmdline(c)}
        time.sleep(0.2)
    assert len(workers) >= 2, "the build never started its two workers"
    time.sleep(1.0)  # let them take actions
    return proc, workers


def _ours(temp: Path) -> list[str]:
    return [p.name for p in temp.iterdir() if p.name.startswith("npubuild-")]


def _cmdline(pid: int) -> str:
    try:
        return (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _gone_within(pids: set[int], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not any(_alive(p) for p in pids):
            return True
        time.sleep(0.1)
    return False


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_workers_die_with_the_build(small_ws, tmp_path, sig):
    temp = tmp_path / "temp"
    temp.mkdir()
    proc, workers = _start_build(small_ws, tmp_path / "cache", temp)
    os.kill(proc.pid, sig)
    proc.wait(timeout=30)
    try:
        assert _gone_within(workers, 10), f"workers {workers} outlived the build"
    finally:
        for w in workers:
            if _alive(w):
                os.kill(w, signal.SIGKILL)
    if sig == signal.SIGTERM:
        assert _ours(temp) == [], "the workers' temporary directories outlived the build"
        return
    # A build killed outright cannot clean up after its workers: the next build with workers does.
    left = _ours(temp)
    assert [name for name in left if name.startswith("npubuild-workers-")], left
    live = temp / f"npubuild-workers-{left[0].split('-')[2]}-{os.getpid()}-live"
    live.mkdir()  # a running build's (this process is alive): kept
    again = cli(["build", "//...", "-j", "2"], small_ws, tmp_path / "cache2", env={"TMPDIR": str(temp)})
    assert again.returncode == 0, again.stderr
    assert _ours(temp) == [live.name], "the killed build's directory outlived the next build"


# slow tier: real processes killed or racing, seconds each (CI runs every tier)
@pytest.mark.slow
def test_ctrl_c_is_quiet_and_exits_130(small_ws, tmp_path):
    temp = tmp_path / "temp"
    temp.mkdir()
    proc, workers = _start_build(small_ws, tmp_path / "cache", temp)
    assert proc.poll() is None, "the build ended before it could be interrupted"
    os.killpg(proc.pid, signal.SIGINT)  # the terminal sends it to the whole foreground group
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr
    assert stderr.strip().splitlines()[-1] == "interrupted", stderr
    assert _gone_within(workers, 10)
    assert _ours(temp) == [], "the killed workers' temporary directories outlived the build"
    # What the interrupted build left in the cache is sound: the next build finishes.
    again = cli(["build", "//...", "-j", "2"], small_ws, tmp_path / "cache")
    assert again.returncode == 0, again.stderr


def test_a_single_process_build_killed_outright_leaves_its_scratch_to_the_next(small_ws, tmp_path):
    """With -j 1 the actions run in the build's own process: killed outright (SIGKILL, the OOM
    killer) it cannot delete the action's scratch directory, so the next build does."""
    temp = tmp_path / "temp"
    temp.mkdir()
    proc = cli_build(small_ws, tmp_path / "cache", "-j", "1", new_session=True, env={"TMPDIR": str(temp)})
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None and not _ours(temp):
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    left = _ours(temp)
    assert left and all(name.startswith("npubuild-action-") for name in left), left
    again = cli(
        ["build", "//models:cls_npu", "--until", "import", "-j", "1"],
        small_ws,
        tmp_path / "cache2",
        env={"TMPDIR": str(temp)},
    )
    assert again.returncode == 0, again.stderr
    assert _ours(temp) == [], "the killed build's scratch outlived the next build"
