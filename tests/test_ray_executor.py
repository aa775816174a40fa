"""Actions as Ray tasks on a real local Ray cluster whose workers have their own store and share the
remote cache (a real nginx with WebDAV) with the driver."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from webdav import WebDavCache, free_port

from conftest import cli_build, fresh_copy, out_digests, run_build
from npubuild.cache.remote import RemoteCache, RemoteCacheConfig
from npubuild.cache.store import Store

# Left out of the quick tier (pytest -m "not slow"): it starts a Ray cluster
pytestmark = pytest.mark.slow


def ray_cli(*args: str, env=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ray.scripts.scripts", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory):
    """A one-node Ray cluster started like a user would (`ray start --head`); its workers' npubuild
    cache is a directory of their own, not the driver's."""
    worker_cache = tmp_path_factory.mktemp("ray-worker-cache")
    port = free_port()
    env = {**os.environ, "NPUBUILD_CACHE": str(worker_cache), "RAY_USAGE_STATS_ENABLED": "0"}
    started = ray_cli(
        "start",
        "--head",
        f"--port={port}",
        "--num-cpus=2",
        "--object-store-memory=100000000",
        "--include-dashboard=false",
        "--disable-usage-stats",
        env=env,
    )
    assert started.returncode == 0, started.stderr
    try:
        yield {"address": f"127.0.0.1:{port}", "worker_cache": worker_cache}
    finally:
        ray_cli("stop", "--force")


def test_actions_run_as_ray_tasks_and_results_travel_through_the_remote_cache(shared, ray_cluster, tmp_path):
    from npubuild.engine.executors import RayExecutor

    ws = fresh_copy(shared["ws"], tmp_path / "ws")
    with WebDavCache(tmp_path / "nginx") as dav:  # an empty remote: everything must run on Ray
        store = Store(tmp_path / "cache")
        remote = RemoteCache(RemoteCacheConfig(url=dav.url))
        executor = RayExecutor(ray_cluster["address"], None)
        try:
            outcome = run_build(ws, store, remote=remote, executor=executor)
        finally:
            executor.close()
            remote.close()
        assert outcome.ok, outcome.errors
        assert outcome.executed() == {(a.stage, a.owner) for a in outcome.actions}
        workers = {outcome.result(a).worker for a in outcome.actions}
        assert "" not in workers and all(int(w.rsplit(":", 1)[1]) != os.getpid() for w in workers)
        # The same bytes as a local build; every result is in the worker's store, the remote and ours.
        assert out_digests(ws) == shared["outputs"]
        worker_store = Store(ray_cluster["worker_cache"])
        keys = [outcome.result(a).key for a in outcome.actions]
        assert all(worker_store.get_action(k) is not None for k in keys)
        assert {p.name for p in dav.entries("ac")} == set(keys)
        assert all(store.get_action(k) is not None for k in keys)
        worker_store.close()
        store.close()

        # Through the CLI: a second build on the cluster finds everything in the local cache.
        proc = cli_build(
            ws,
            tmp_path / "cache",
            "--executor",
            "ray",
            "--ray-address",
            ray_cluster["address"],
            "--remote-cache",
            dav.url,
        )
        stdout, stderr = proc.communicate(timeout=600)
        assert proc.returncode == 0, stderr
        assert f"Build OK: {len(keys)} actions ({len(keys)} cached)" in stdout
