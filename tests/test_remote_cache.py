"""The shared remote cache against a real nginx with WebDAV on loopback: two clean local caches
sharing one remote, read-only clients, a remote serving wrong bytes, a remote that is unreachable
or goes down mid-build."""

from __future__ import annotations

import shutil
import time

from webdav import WebDavCache, free_port

from conftest import build_with, cli_build, fresh_copy, out_digests


def test_a_clean_cache_downloads_every_result_and_runs_nothing(shared, tmp_path):
    first, dav = shared["outcome"], shared["dav"]
    ran = first.executed()
    assert len(ran) == len(first.actions)  # the cold build ran everything and wrote it up
    assert len(dav.entries("ac")) == len(first.actions)
    # Blobs were sent once, over kept-alive connections.
    log = dav.requests()
    puts = [u for _, m, u, _ in log if m == "PUT"]
    assert len(puts) == len(set(puts))
    assert len({c for c, *_ in log}) < len(log) / 10

    ws = fresh_copy(shared["ws"], tmp_path / "ws")
    outcome, remote = build_with(ws, tmp_path / "cache-b", dav.url)
    assert outcome.ok, outcome.errors
    assert outcome.executed() == set()
    assert all(r.status == "cached" and r.downloaded for r in outcome.results.values())
    assert out_digests(ws) == shared["outputs"]
    assert remote.problems == [] and remote.down is None


def test_read_mode_uses_the_remote_and_never_writes_to_it(shared, tmp_path):
    dav = shared["dav"]
    ws = fresh_copy(shared["ws"], tmp_path / "ws")
    build = ws / "models" / "BUILD"
    build.write_text(build.read_text().replace('"check_samples": 2', '"check_samples": 1'))
    before = (dav.entries("ac"), dav.entries("cas"))
    logged = len(dav.requests())
    outcome, _ = build_with(ws, tmp_path / "cache-c", dav.url, mode="read")
    assert outcome.ok, outcome.errors
    # check_samples is a parameter of optimize only; its output is the same model, so nothing after it reruns.
    assert outcome.executed() == {("optimize", "//models:cls_npu")}
    assert (dav.entries("ac"), dav.entries("cas")) == before
    methods = {m for _, m, _, _ in dav.requests()[logged:]}
    assert "GET" in methods and "PUT" not in methods


def test_wrong_bytes_in_the_remote_are_rejected_rebuilt_and_overwritten(shared, tmp_path):
    first = shared["outcome"]
    (imp,) = [a for a in first.actions if a.stage == "import"]
    (ev,) = [a for a in first.actions if a.stage == "evaluate"]
    imported = first.result(imp).outputs["model"]
    # A copy of the shared cache, so the other tests keep a good one.
    root = tmp_path / "nginx"
    shutil.copytree(shared["dav"].store, root / "data" / "cache")
    with WebDavCache(root) as dav:
        blob = dav.store / "cas" / imported
        good = blob.read_bytes()
        blob.write_bytes(good[: len(good) // 2])  # truncated
        (dav.store / "ac" / first.result(ev).key).write_text('{"stage": "evaluate", "outputs": ')
        ws = fresh_copy(shared["ws"], tmp_path / "ws")
        outcome, remote = build_with(ws, tmp_path / "cache-d", dav.url)
        assert outcome.ok, outcome.errors
        # import rebuilt the same bytes, so everything after it still came from the remote.
        assert outcome.executed() == {("import", "//models:cls"), ("evaluate", "//models:cls_npu")}
        assert out_digests(ws) == shared["outputs"]
        assert len(outcome.warnings) == 2
        assert any(f"cas/{imported[:12]}" in n and "hash to" in n for n in outcome.warnings)
        assert any(f"ac/{first.result(ev).key[:12]}" in n for n in outcome.warnings)
        # Read-write: the good bytes replaced the bad ones.
        assert blob.read_bytes() == good
        # A third clean cache now runs nothing.
        again, _ = build_with(fresh_copy(shared["ws"], tmp_path / "ws3"), tmp_path / "cache-e", dav.url)
        assert again.executed() == set() and again.warnings == []


def test_an_unreachable_remote_gives_one_warning_and_a_local_build(shared, tmp_path):
    ws = fresh_copy(shared["ws"], tmp_path / "ws")
    url = f"http://127.0.0.1:{free_port()}/cache"
    proc = cli_build(ws, tmp_path / "cache", "--remote-cache", url, "--until", "import")
    stdout, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 0, stderr
    warnings = [line for line in stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and url in warnings[0] and "local cache only" in warnings[0]
    assert "Traceback" not in stderr and "Build OK" in stdout


def test_the_remote_going_down_mid_build(shared, tmp_path):
    ws = fresh_copy(shared["ws"], tmp_path / "ws")
    with WebDavCache(tmp_path / "nginx") as dav:
        proc = cli_build(ws, tmp_path / "cache", "--remote-cache", dav.url, "-j", "2")
        deadline = time.monotonic() + 300
        while len(dav.entries("ac")) < 3 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        written = len(dav.entries("ac"))
        dav.stop()
        stdout, stderr = proc.communicate(timeout=600)
    assert 3 <= written < len(shared["outcome"].actions)  # it really went down mid-build
    assert proc.returncode == 0, stderr
    warnings = [line for line in stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "unreachable" in warnings[0], stderr
    assert "Traceback" not in stderr
    assert out_digests(ws) == shared["outputs"]


def test_bad_remote_options_are_one_line_errors(shared, tmp_path):
    ws = shared["ws"]
    for args, message in [
        (["--remote-cache", "ftp://host/cache"], "http:// or https://"),
        (["--remote-cache", "http://h/c", "--remote-cache-mode", "write"], "readwrite or read"),
        (["--executor", "ray"], "needs --remote-cache"),
        (["--executor", "slurm"], "local or ray"),
    ]:
        proc = cli_build(ws, tmp_path / "cache", *args)
        stdout, stderr = proc.communicate(timeout=120)
        assert proc.returncode == 1, (args, stderr)
        lines = [line for line in stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("error:") and message in lines[0], (args, stderr)
