"""Where actions run: a local process pool (the default) or tasks on a Ray cluster.

Both take the same plain-JSON action description and return the same plain-JSON reply; results
travel through the stores (the local one, or for Ray the shared remote cache), never as pickled
Python objects of ours.
"""

from __future__ import annotations

import json
import os
import shutil
from concurrent.futures import Future

from npubuild.cache.store import default_cache_dir
from npubuild.engine.lifetime import bind_to_parent
from npubuild.errors import UserError
from npubuild.tempdirs import owned_tempdir


class LocalExecutor:
    """Runs in this process when jobs == 1, else in a pool of spawned processes sharing the store."""

    shares_local_store = True

    def __init__(self, store_dir: str, jobs: int):
        self.store_dir = store_dir
        self.slots = max(1, jobs)
        self._pool = None
        # the workers' temporary directories go in one of the pool's own, deleted with the pool:
        # a worker killed mid-action (abort) cannot delete its own; a build killed outright leaves
        # it to the next build (tempdirs.py)
        self._temp: str | None = None

    def submit(self, desc: dict, remote_config: dict | None) -> Future:
        from npubuild.engine.worker import execute

        if self.slots == 1:
            future: Future = Future()
            future.set_result(execute(self.store_dir, desc, remote_config))
            return future
        if self._pool is None:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor

            self._temp = owned_tempdir("workers")
            self._pool = ProcessPoolExecutor(
                self.slots,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=bind_to_parent,
                initargs=(os.getpid(), self._temp),
            )
        return self._pool.submit(execute, self.store_dir, desc, remote_config)

    def shutdown(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        self._remove_temp()

    def abort(self) -> None:
        """Stop now (Ctrl-C, an error escaping the build): kill the workers rather than wait for
        their actions. A killed action never wrote its cache entry, so the cache stays right."""
        if self._pool is not None:
            processes = list(getattr(self._pool, "_processes", {}).values())
            for process in processes:
                process.kill()
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
            for process in processes:
                process.join(5)  # dead before its directory goes
        self._remove_temp()

    def _remove_temp(self) -> None:
        if self._temp is not None:
            shutil.rmtree(self._temp, ignore_errors=True)
            self._temp = None


def run_on_ray_worker(desc_json: str, remote_json: str) -> str:
    """The Ray task: JSON in, JSON out. The worker's own store is its machine's npubuild cache."""
    import socket

    from npubuild.engine.worker import execute

    reply = execute(str(default_cache_dir()), json.loads(desc_json), json.loads(remote_json))
    reply["worker"] = f"{socket.gethostname()}:{os.getpid()}"
    return json.dumps(reply)


class RayExecutor:
    """Actions as Ray tasks; every worker reads inputs from and writes results to the remote cache."""

    shares_local_store = False

    def __init__(self, address: str | None, jobs: int | None):
        try:
            import ray
        except ImportError:
            raise UserError(
                "--executor ray needs Ray: pip install 'npubuild[ray]' (or pip install ray)"
            ) from None
        try:
            ray.init(address=address, ignore_reinit_error=True, log_to_driver=False, logging_level="ERROR")
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise UserError(f"cannot connect to the Ray cluster at {address}: {exc}") from None
        self._ray = ray
        self._task = ray.remote(num_cpus=1, max_retries=1)(run_on_ray_worker)
        self.slots = jobs or max(1, int(ray.cluster_resources().get("CPU", 1)))

    def submit(self, desc: dict, remote_config: dict | None) -> Future:
        ref = self._task.remote(json.dumps(desc, sort_keys=True), json.dumps(remote_config))
        outer: Future = Future()
        inner = ref.future()
        inner.add_done_callback(lambda f: _relay_json(f, outer))
        return outer

    def shutdown(self) -> None:
        """Between rounds of one build: keep the connection to the cluster."""

    def abort(self) -> None:
        """Ray cancels a driver's tasks when the driver goes away."""

    def close(self) -> None:
        self._ray.shutdown()


def _relay_json(inner: Future, outer: Future) -> None:
    try:
        outer.set_result(json.loads(inner.result()))
    except Exception as exc:  # the task or its worker died: the builder reports it as a failure
        outer.set_exception(exc)
