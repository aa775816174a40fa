"""Corrupt cache entries are detected, evicted and rebuilt; a build killed mid-stage leaves a
cache from which the next build gives correct results; a no-op build stays light."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import cli, run_build
from npubuild.cache.store import Store


def outputs(ws):
    out = ws / "npubuild-out"
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


def result_of(outcome, stage):
    (action,) = [a for a in outcome.actions if a.stage == stage]
    return outcome.result(action)


def corrupt(store: Store, digest: str) -> None:
    path = store.blob_path(digest)
    assert path is not None
    with open(path, "r+b") as f:
        f.seek(100)
        byte = f.read(1)
        f.seek(100)
        f.write(bytes([byte[0] ^ 0xFF]))


def test_corrupt_input_blob_is_evicted_and_its_producer_rebuilt(small_ws, warm_store):
    first = run_build(small_ws, warm_store)
    canonical = result_of(first, "import").outputs["model"]
    corrupt(warm_store, canonical)
    # Make optimize rerun, so it reads the corrupt canonical model.
    build = small_ws / "models" / "BUILD"
    build.write_text(build.read_text().replace('"check_samples": 2', '"check_samples": 1'))
    outcome = run_build(small_ws, warm_store)
    assert outcome.ok, outcome.errors
    assert outcome.executed() == {("import", "//models:cls"), ("optimize", "//models:cls_npu")}
    assert warm_store.read_bytes(canonical)  # rebuilt, verified


def test_corrupt_blob_found_while_materialising_is_rebuilt(small_ws, warm_store):
    first = run_build(small_ws, warm_store)
    expected = outputs(small_ws)
    corrupt(warm_store, result_of(first, "optimize").outputs["model"])
    (small_ws / "npubuild-out" / "models" / "cls_npu" / "optimized.onnx").unlink()
    outcome = run_build(small_ws, warm_store)
    assert outcome.ok
    assert outcome.executed() == {("optimize", "//models:cls_npu")}
    assert outputs(small_ws) == expected


# slow tier: real processes killed or racing, seconds each (CI runs every tier)
@pytest.mark.slow
def test_sigkill_mid_build_leaves_a_usable_cache(small_ws, tmp_path):
    reference_cache = tmp_path / "reference"
    assert cli(["build", "//...", "-j", "1"], small_ws, reference_cache).returncode == 0
    expected = outputs(small_ws)
    cache = tmp_path / "killed"
    env = {**os.environ, "NPUBUILD_CACHE": str(cache)}
    for delay in (0.6, 1.2, 1.8, 2.4):  # land in different stages
        for p in (small_ws / "npubuild-out").rglob("*"):
            if p.is_file():
                p.unlink()
        proc = subprocess.Popen(
            [sys.executable, "-m", "npubuild", "build", "//...", "-j", "1"],
            cwd=small_ws,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    final = cli(["build", "//...", "-j", "1"], small_ws, cache)
    assert final.returncode == 0, final.stderr
    assert outputs(small_ws) == expected


def test_a_write_removes_the_temporary_file_a_killed_writer_left(tmp_path):
    """A build killed while it copied an output leaves `.NAME.PID.*.tmp` beside it (what the test
    above once found in the outputs after the rebuild); the next write of that output removes it,
    and leaves a running writer's."""
    store = Store(tmp_path / "cache")
    digest = store.put_bytes(b"artifact")
    dest = tmp_path / "out" / "model.npub"
    dest.parent.mkdir()
    finished = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True)
    dead = int(finished.stdout)  # a process that has exited
    orphan = dest.parent / f".model.npub.{dead}.abc123.tmp"
    live = dest.parent / f".model.npub.{os.getppid()}.def456.tmp"
    other = dest.parent / f".other.bin.{dead}.abc123.tmp"
    for p in (orphan, live, other):
        p.write_bytes(b"partial")
    store.copy_to(digest, dest)
    assert dest.read_bytes() == b"artifact"
    assert not orphan.exists() and live.exists() and other.exists()


def test_noop_build_imports_no_onnx_onnxruntime_or_numpy(small_ws, tmp_path):
    cache = tmp_path / "cache"
    assert cli(["build", "//...", "-j", "1"], small_ws, cache).returncode == 0
    code = (
        "import sys, runpy; sys.argv = ['npubuild', 'build', '//...'];\n"
        "try:\n    runpy.run_module('npubuild', run_name='__main__')\n"
        "except SystemExit as e:\n    assert not e.code, e.code\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('onnx', 'onnxruntime', 'numpy'))\n"
        "print('HEAVY', heavy)\n"
    )
    env = {**os.environ, "NPUBUILD_CACHE": str(cache)}
    proc = subprocess.run([sys.executable, "-c", code], cwd=small_ws, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "HEAVY []" in proc.stdout
    assert "Build OK: 10 actions (10 cached)" in proc.stdout


def test_explain_names_the_input_that_changed(small_ws, warm_cache):
    cache = warm_cache
    assert cli(["build", "//models:cls_npu"], small_ws, cache).returncode == 0
    build = small_ws / "data" / "BUILD"
    build.write_text(build.read_text().replace('"mean": [0.5]', '"mean": [0.4]'))
    assert cli(["build", "//models:cls_npu"], small_ws, cache).returncode == 0
    proc = cli(["explain", "//models:cls_npu"], small_ws, cache)
    assert proc.returncode == 0
    lines = proc.stdout.splitlines()
    text = "\n".join(lines)
    settings = {ln.strip() for ln in lines if ln.strip().startswith("setting ")}
    # only what changed (not resize, std, ...), with its old and new value: the data set's mean,
    # and the quantizer's input range that follows from it (docs/quantization.md)
    assert settings == {
        "setting preprocess.mean changed: [0.5] -> [0.4]",
        "setting input_range changed: [-1.0, 1.0] -> [-0.8, 1.2]",
    }
    assert "input //data:calib prepare.tensors changed" in text
    import_line = next(ln for ln in lines if ln.strip().startswith("import"))
    assert "cached" in import_line
    # a no-op afterwards: nothing changed since the last build
    assert cli(["build", "//models:cls_npu"], small_ws, cache).returncode == 0
    again = cli(["explain", "//models:cls_npu"], small_ws, cache).stdout
    assert "changed" not in again and "ran" not in again
    # another hardware target: one line naming both, not one per field of the target's description
    models = small_ws / "models" / "BUILD"
    models.write_text(models.read_text().replace("    optimize =", '    target = "vnpu-s",\n    optimize ='))
    assert cli(["build", "//models:cls_npu"], small_ws, cache).returncode == 0
    moved = cli(["explain", "//models:cls_npu"], small_ws, cache).stdout.splitlines()
    target_lines = {ln.strip() for ln in moved if "target" in ln and ("->" in ln or "setting" in ln)}
    assert target_lines == {"target: vnpu-m -> vnpu-s"}, moved


def test_query_and_cache_stats(small_ws, warm_cache):
    cache = warm_cache
    listing = cli(["query"], small_ws, cache)
    assert listing.returncode == 0
    assert [ln.split()[0] for ln in listing.stdout.splitlines()] == [
        "//data:calib",
        "//data:eval",
        "//models:cls",
        "//models:cls_npu",
    ]
    lines = listing.stdout.splitlines()
    assert len({ln.index(ln.split()[1]) for ln in lines}) == 1, lines  # the kinds line up
    assert len({ln.index(ln.split()[2]) for ln in lines}) == 1, lines  # and the locations
    deps = cli(["query", "--deps", "//models:cls_npu"], small_ws, cache)
    assert "depends on //models:cls (onnx_model)" in deps.stdout
    assert "step optimize: optimize for //models:cls_npu" in deps.stdout
    assert cli(["build", "//..."], small_ws, cache).returncode == 0
    stats = cli(["cache", "stats"], small_ws, cache).stdout
    assert "action results (ac) 10" in stats
    assert cli(["clean"], small_ws, cache).returncode == 0
    assert not (small_ws / "npubuild-out").exists()
    assert cli(["clean", "--expunge"], small_ws, cache).returncode == 0
    assert not cache.exists()


def test_noop_build_does_not_rehash_unchanged_sources(small_ws, warm_store, monkeypatch):
    past = 1_600_000_000_000_000_000
    for p in small_ws.rglob("*"):
        if p.is_file():
            os.utime(p, ns=(past, past))
    assert run_build(small_ws, warm_store).ok
    assert run_build(small_ws, warm_store).executed() == set()  # settles the stat cache

    import npubuild.cache.store as store_module

    def no_hashing(path):
        raise AssertionError(f"re-hashed {path}")

    monkeypatch.setattr(store_module, "sha256_file", no_hashing)
    outcome = run_build(small_ws, warm_store)
    assert outcome.ok and outcome.executed() == set()


# slow tier: real processes killed or racing, seconds each (CI runs every tier)
@pytest.mark.slow
def test_two_builds_sharing_one_cache_agree(small_ws, tmp_path, warm_cache):
    # the outputs one build alone gives (from the session's build: the two below start cold)
    assert cli(["build", "//...", "-j", "1"], small_ws, warm_cache).returncode == 0
    expected = outputs(small_ws)
    shared = tmp_path / "shared"
    env = {**os.environ, "NPUBUILD_CACHE": str(shared)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "npubuild", "build", "//...", "-j", "1"],
            cwd=small_ws,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    for p in procs:
        _, stderr = p.communicate(timeout=600)
        assert p.returncode == 0, stderr
    assert outputs(small_ws) == expected
    again = cli(["build", "//..."], small_ws, shared)
    assert "Build OK: 10 actions (10 cached)" in again.stdout


def test_a_noop_build_prints_the_summary_kept_from_the_last_rendering(small_ws, store, monkeypatch):
    import io

    from rich.console import Console

    from npubuild import report

    def render(outcome) -> str:
        console = Console(file=io.StringIO(), width=200, highlight=False)
        report.render_build(console, store, outcome)
        return console.file.getvalue()

    cold = render(run_build(small_ws, store))
    first_noop = render(run_build(small_ws, store))
    assert first_noop != cold  # "ran" became "cached": rendered anew, then kept
    assert "cls_npu" in first_noop and " cos 0." in first_noop

    def no_reads(*args):
        raise AssertionError("a summary was read although the kept rendering applies")

    with monkeypatch.context() as m:
        m.setattr(report, "summary_of", no_reads)
        assert render(run_build(small_ws, store)) == first_noop
    kept = store.get_meta("rendered_build")["digest"]
    with open(store.blob_path(kept), "r+b") as f:  # a damaged kept rendering is not trusted
        f.write(b"garbage")
    assert render(run_build(small_ws, store)) == first_noop
