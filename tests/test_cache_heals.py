"""The store claims only what it can show: lost blob files, garbage index rows, a damaged or
read-only cache database and a full disk each give a rebuild or one clear line, never a wrong
"Build OK" or a traceback."""

from __future__ import annotations

import contextlib
import os
import stat
import subprocess
from pathlib import Path

import pytest

from conftest import cli, run_build
from npubuild.cache.digest import sha256_file
from npubuild.cache.store import Store

OPTIMIZE = ("optimize", "//models:cls_npu")
IMPORT = ("import", "//models:cls")


def outputs(ws: Path) -> dict[str, bytes]:
    out = ws / "npubuild-out"
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


def result_of(outcome, stage):
    (action,) = [a for a in outcome.actions if a.stage == stage]
    return outcome.result(action)


def until_optimize(ws, store):
    return run_build(ws, store, ("//models:cls_npu",), until="optimize")


def test_a_deleted_blob_file_is_rebuilt_and_its_output_materialised(small_ws, store):
    first = until_optimize(small_ws, store)
    expected = outputs(small_ws)
    digest = result_of(first, "optimize").outputs["model"]
    os.unlink(store.blob_path(digest))  # what a tmp cleaner ageing the cache's files does
    (small_ws / "npubuild-out" / "models" / "cls_npu" / "optimized.onnx").unlink()
    outcome = until_optimize(small_ws, store)
    assert outcome.ok, outcome.errors
    assert outcome.executed() == {OPTIMIZE}
    assert outputs(small_ws) == expected
    assert until_optimize(small_ws, store).executed() == set()


def test_a_deleted_source_copy_is_stored_again(small_ws, store):
    first = until_optimize(small_ws, store)
    source = sha256_file(small_ws / "models" / "cls.onnx")
    os.unlink(store.blob_path(source))
    os.unlink(store.blob_path(result_of(first, "import").outputs["model"]))
    outcome = until_optimize(small_ws, store)
    assert outcome.ok, outcome.errors
    assert outcome.executed() == {IMPORT}
    assert store.read_bytes(source) == (small_ws / "models" / "cls.onnx").read_bytes()


def test_a_blob_file_of_the_wrong_size_is_a_miss(small_ws, store):
    first = until_optimize(small_ws, store)
    path = store.blob_path(result_of(first, "optimize").outputs["log"])
    with open(path, "ab") as f:
        f.write(b"appended")
    outcome = until_optimize(small_ws, store)
    assert outcome.ok and outcome.executed() == {OPTIMIZE}


@pytest.mark.parametrize(
    "garbage",
    ['{"stage": "optimize"', '{"stage": "optimize", "outputs": {"../../x": "' + "0" * 64 + '"}}', "[]"],
)
def test_a_garbage_action_entry_is_dropped_and_rebuilt(small_ws, store, garbage):
    first = until_optimize(small_ws, store)
    key = result_of(first, "optimize").key
    store._cache.set(f"ac/{key}", garbage)
    outcome = until_optimize(small_ws, store)
    assert outcome.ok, outcome.errors
    assert outcome.executed() == {OPTIMIZE}
    assert store.get_action(key)["outputs"].keys() == {"model", "log", "summary"}


def test_an_entry_naming_other_outputs_is_not_used(small_ws, store):
    """Well-formed JSON, but not what the stage writes (a poisoned remote left it): a miss."""
    first = until_optimize(small_ws, store)
    key = result_of(first, "optimize").key
    model = result_of(first, "optimize").outputs["model"]
    store.put_action(key, {"stage": "optimize", "outputs": {"model": model}})
    outcome = until_optimize(small_ws, store)
    assert outcome.ok, outcome.errors
    assert outcome.executed() == {OPTIMIZE}


def test_garbage_metadata_is_dropped(small_ws, store):
    until_optimize(small_ws, store)
    names = [k for k in store._cache.iterkeys() if isinstance(k, str) and k.startswith("meta/")]
    assert names
    for name in names:
        store._cache.set(name, "not json {")
    outcome = until_optimize(small_ws, store)
    assert outcome.ok, outcome.errors
    assert outcome.executed() == set()
    assert any("damaged entries" in w for w in outcome.warnings)


def test_a_pickled_row_is_never_unpickled(tmp_path):
    store = Store(tmp_path / "cache")
    try:
        store._cache.set("ac/" + "a" * 64, {"a pickled": "dict"})  # diskcache pickles a dict
        assert store.get_action("a" * 64) is None
        assert "ac/" + "a" * 64 not in store._cache
    finally:
        store.close()


def test_an_in_place_edit_that_restores_the_mtime_is_seen(small_ws, store):
    build = small_ws / "models" / "BUILD"
    old = os.stat(build).st_mtime_ns - 60_000_000_000  # old enough for the stat cache to trust
    os.utime(build, ns=(old, old))
    until_optimize(small_ws, store)
    inode = os.stat(build).st_ino
    text = build.read_text()
    with open(build, "r+") as f:  # same inode, same size
        f.write(text.replace('"check_samples": 2', '"check_samples": 1'))
    os.utime(build, ns=(old, old))
    assert os.stat(build).st_ino == inode and os.stat(build).st_mtime_ns == old
    assert until_optimize(small_ws, store).executed() == {OPTIMIZE}


def test_outputs_follow_the_umask(small_ws, store):
    until_optimize(small_ws, store)
    mask = os.umask(0)
    os.umask(mask)
    for path in (small_ws / "npubuild-out").rglob("*"):
        if path.is_file():
            assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~mask, path


def test_an_output_directory_that_is_a_file_is_one_error(small_ws, tmp_path):
    (small_ws / "npubuild-out").write_text("not a directory")
    proc = cli(["build", "//models:cls_npu", "--until", "import"], small_ws, tmp_path / "cache")
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "cannot write the output" in errors[0], proc.stderr


def test_a_damaged_cache_database_is_set_aside(small_ws, tmp_path):
    cache = tmp_path / "cache"
    assert cli(["build", "//models:cls_npu", "--until", "import"], small_ws, cache).returncode == 0
    (cache / "cache.db").write_bytes(b"this is not an sqlite database" * 100)
    proc = cli(["build", "//models:cls_npu", "--until", "import"], small_ws, cache)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    warnings = [ln for ln in proc.stderr.splitlines() if ln.startswith("warning:")]
    assert len(warnings) == 1 and "damaged" in warnings[0], proc.stderr
    assert list(cache.glob("cache.db.damaged-*"))
    again = cli(["build", "//models:cls_npu", "--until", "import"], small_ws, cache)
    assert again.returncode == 0 and "(1 cached)" in again.stdout and "warning" not in again.stderr


def test_clean_expunge_removes_a_damaged_cache(small_ws, tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "cache.db").write_bytes(b"\0garbage" * 64)
    proc = cli(["clean", "--expunge"], small_ws, cache)
    assert proc.returncode == 0, proc.stderr
    assert not cache.exists()


@contextlib.contextmanager
def tmpfs(path: Path, size: str):
    path.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def test_a_read_only_cache_builds_without_caching(small_ws, tmp_path):
    temp = tmp_path / "temp"  # where the private cache goes (and must not stay)
    temp.mkdir()
    with tmpfs(tmp_path / "ro", "64m") as cache:
        assert cli(["build", "//models:cls_npu", "--until", "import"], small_ws, cache).returncode == 0
        subprocess.run(["mount", "-o", "remount,ro", str(cache)], check=True)
        proc = cli(
            ["build", "//models:cls_npu", "--until", "optimize"], small_ws, cache, env={"TMPDIR": str(temp)}
        )
        assert not [p.name for p in temp.iterdir() if p.name.startswith("npubuild-nocache-")]
        assert proc.returncode == 0, proc.stderr
        warnings = [ln for ln in proc.stderr.splitlines() if ln.startswith("warning:")]
        assert len(warnings) == 1 and "building without a cache" in warnings[0], proc.stderr
        assert (small_ws / "npubuild-out" / "models" / "cls_npu" / "optimized.onnx").is_file()


def test_a_full_disk_is_one_error_and_leaves_the_cache_usable(small_ws, tmp_path):
    reference = tmp_path / "reference"
    assert cli(["build", "//models:cls_npu", "--until", "optimize"], small_ws, reference).returncode == 0
    expected = outputs(small_ws)
    with tmpfs(tmp_path / "full", "1500k") as cache:
        proc = cli(["build", "//models:cls_npu", "--until", "optimize", "-j", "1"], small_ws, cache)
        assert proc.returncode == 1
        assert "Traceback" not in proc.stderr
        errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
        assert len(errors) == 1 and "No space left on device" in errors[0], proc.stderr
        subprocess.run(["mount", "-o", "remount,size=256m", str(cache)], check=True)
        again = cli(["build", "//models:cls_npu", "--until", "optimize"], small_ws, cache)
        assert again.returncode == 0, again.stderr
        assert outputs(small_ws) == expected
