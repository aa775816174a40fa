"""Where actions run: a local process pool (the default) or tasks on a Ray cluster.

Both take the same plain-JSON action description and return the same plain-JSON reply; results
travel through the stores (the local one, or for Ray the shared remote cache), never as pickled
Python objects of ours.
"""

from __future__ import annotations

import json
import os
from concurrent.futures import Future

from npubuild.cache.store import default_cache_dir
from npubuild.errors import UserError


class LocalExecutor:
    """Runs in this process when jobs == 1, else in a pool of spawned processes sharing the store."""

    shares_local_store = True

    def __init__(self, store_dir: str, jobs: int):
        self.store_dir = store_dir
        self.slots = max(1, jobs)
        self._pool = None

    def submit(self, desc: dict, remote_config: dict | None) -> Future:
        from npubuild.engine.worker import execute

        if self.slots == 1:
            future: Future = Future()
            future.set_result(execute(self.store_dir, desc, remote_config))
            return future
        if self._pool is None:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor

            self._pool = ProcessPoolExecutor(self.slots, mp_context=multiprocessing.get_context("spawn"))
        return self._pool.submit(execute, self.store_dir, desc, remote_config)

    def shutdown(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None


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

    def close(self) -> None:
        self._ray.shutdown()


def _relay_json(inner: Future, outer: Future) -> None:
    try:
        outer.set_result(json.loads(inner.result()))
    except Exception as exc:  # the task or its worker died: the builder reports it as a failure
        outer.set_exception(exc)
