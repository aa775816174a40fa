"""The scheduler: compute each action's key once its inputs are known, reuse or run it.

Keys come from input *digests*, so an upstream rerun that yields the same bytes leaves every key
downstream unchanged (early cutoff). Nothing here imports onnx, onnxruntime or numpy: a build that
finds everything cached never loads them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass, field

from npubuild.cache.shared import download_action, upload_action, upload_blob
from npubuild.cache.store import CorruptBlob, Store, is_result_of
from npubuild.engine.actions import Action, Output, SourceFile
from npubuild.stages import STAGES

MAX_ROUNDS = 3


class NeedsExecution(Exception):
    """Raised by a Builder that may not execute (the fast no-op path) when an action must run."""


@dataclass
class ActionResult:
    status: str  # "ran" | "cached" | "failed" | "skipped" | "corrupt"
    key: str = ""
    inputs: dict[str, str] = field(default_factory=dict)
    outputs: dict[str, str] = field(default_factory=dict)
    message: str = ""
    seconds: float = 0.0
    traceback: str = ""
    downloaded: bool = False  # a cache hit that came from the remote cache
    worker: str = ""  # host:pid of the Ray worker that ran it

    @property
    def ok(self) -> bool:
        return self.status in ("ran", "cached")


class Progress:
    """Hooks for a live display; the default does nothing."""

    def started(self, action: Action) -> None: ...

    def finished(self, action: Action, result: ActionResult) -> None: ...


class Builder:
    def __init__(
        self,
        store: Store,
        jobs: int = 1,
        keep_going: bool = False,
        progress: Progress | None = None,
        execute: bool = True,
        remote=None,
        executor=None,
    ):
        self.store = store
        self.execute = execute
        self.keep_going = keep_going
        self.progress = progress or Progress()
        self.remote = remote  # a RemoteCache, or None for the local cache only
        self._executor = executor  # made on first use: a LocalExecutor unless one was given
        self.jobs = executor.slots if executor is not None else max(1, jobs)
        self.remote_notes: list[str] = []  # warnings about the remote cache, each once

    def run(self, actions: list[Action]) -> dict[str, ActionResult]:
        """Results by action identity. Reruns a round when a worker found a corrupt cached input."""
        executed: set[str] = set()
        results: dict[str, ActionResult] = {}
        try:
            for _ in range(MAX_ROUNDS):
                results = self._round(actions, executed)
                if not any(r.status == "corrupt" for r in results.values()):
                    break
        except BaseException:
            if self._executor is not None:
                self._executor.abort()
            raise
        if self._executor is not None:
            self._executor.shutdown()
        for identity in executed:
            if results.get(identity) and results[identity].status == "cached":
                results[identity].status = "ran"  # it ran in an earlier round
        self._note_remote()
        return results

    def _submit(self, action: Action, desc: dict) -> Future:
        if self._executor is None:
            from npubuild.engine.executors import LocalExecutor

            self._executor = LocalExecutor(str(self.store.directory), self.jobs)
        remote = self.remote
        if remote is not None and not self._executor.shares_local_store:
            # A worker elsewhere reads the action's source files from the shared cache.
            for name, i in action.inputs.items():
                if isinstance(i, SourceFile):
                    upload_blob(self.store, remote, desc["inputs"][name])
        config = remote.config.model_dump() if remote is not None and remote.down is None else None
        return self._executor.submit(desc, config)

    def _note_remote(self, reply: dict | None = None) -> None:
        """Collect the remote cache's warnings: bad entries, and once, that it went down."""
        if self.remote is None:
            return
        problems = list(self.remote.problems) + list((reply or {}).get("remote_problems", []))
        self.remote.problems.clear()
        down = self.remote.down or (reply or {}).get("remote_down")
        if down and self.remote.down is None:
            self.remote.down = down
        if down and not any(n.startswith("remote cache ") for n in self.remote_notes):
            problems.append(f"remote cache {down}; going on with the local cache only")
        self.remote_notes.extend(p for p in problems if p not in self.remote_notes)

    def _round(self, actions: list[Action], executed: set[str]) -> dict[str, ActionResult]:
        results: dict[str, ActionResult] = {}
        pending = list(actions)
        running: dict[Future, tuple[Action, ActionResult, float]] = {}
        stop = False
        while pending or running:
            still: list[Action] = []
            for action in pending:
                deps = [i.action.identity for i in action.inputs.values() if isinstance(i, Output)]
                if any(d in results and not results[d].ok for d in deps):
                    results[action.identity] = ActionResult("skipped", message="a dependency failed")
                    continue
                if stop or not all(d in results for d in deps) or len(running) >= self.jobs:
                    still.append(action)
                    continue
                result = self._prepare(action, results)
                if result.status != "pending":
                    results[action.identity] = result
                    continue
                if not self.execute:
                    raise NeedsExecution(action.stage)
                try:
                    for name, i in action.inputs.items():
                        if isinstance(i, SourceFile):
                            self.store.put_source(i.path, result.inputs[name])
                except (OSError, CorruptBlob):
                    results[action.identity] = ActionResult(
                        "failed", message="a source file changed or vanished during the build; build again"
                    )
                    continue
                self.progress.started(action)
                desc = action.describe(result.inputs, self._producer_keys(action, results))
                running[self._submit(action, desc)] = (action, result, time.perf_counter())
            pending = still
            if stop and not running:
                for action in pending:
                    results[action.identity] = ActionResult("skipped", message="build stopped after an error")
                break
            if not running:
                continue
            done, _ = wait(list(running), return_when=FIRST_COMPLETED)
            for future in done:
                action, result, started = running.pop(future)
                result.seconds = time.perf_counter() - started
                try:
                    reply = future.result()
                except Exception as exc:  # a worker process died (killed, out of memory)
                    reply = {"status": "failed", "message": f"worker died: {type(exc).__name__}: {exc}"}
                self._note_remote(reply)
                if reply["status"] == "ok" and not self._fetch_outputs(action, result):
                    reply = {"status": "failed", "message": "the outputs are not in the remote cache"}
                result.worker = reply.get("worker", "")
                if reply["status"] == "ok":
                    result.status, result.outputs = "ran", reply["outputs"]
                    executed.add(action.identity)
                else:
                    result.status = reply["status"]
                    result.message = reply["message"]
                    result.traceback = reply.get("traceback", "")
                    if result.status == "failed" and not self.keep_going:
                        stop = True
                results[action.identity] = result
                self.progress.finished(action, result)
        return results

    def _prepare(self, action: Action, results: dict[str, ActionResult]) -> ActionResult:
        """Input digests and key; 'cached' when the action cache has it, else 'pending'."""
        digests: dict[str, str] = {}
        for name, i in action.inputs.items():
            if isinstance(i, SourceFile):
                try:
                    digests[name] = self.store.source_digest(i.path)
                except OSError as exc:
                    return ActionResult("failed", message=f"cannot read {i.display}: {exc.strerror}")
            else:
                digests[name] = results[i.action.identity].outputs[i.name]
        key = action.key(digests)
        hit = self.store.get_action(key)
        if hit is not None and not is_result_of(hit, action.stage, STAGES[action.stage].outputs):
            self.store.delete_action(key)  # written by hand or by a poisoned remote: not ours
            hit = None
        if hit is not None and all(self.store.has_blob(d) for d in hit["outputs"].values()):
            if self.remote is not None and self.remote.writable and not self.remote.has_action(key):
                upload_action(self.store, self.remote, key, hit)  # built before the remote was in use
            return ActionResult("cached", key, digests, hit["outputs"])
        if self.remote is not None:
            hit = download_action(self.store, self.remote, key, action.stage, STAGES[action.stage].outputs)
            if hit is not None:
                return ActionResult("cached", key, digests, hit["outputs"], downloaded=True)
        return ActionResult("pending", key, digests)

    def _fetch_outputs(self, action: Action, result: ActionResult) -> bool:
        """A worker with its own store left the outputs in the remote cache: bring them here."""
        if self._executor is None or self._executor.shares_local_store:
            return True
        if self.remote is None:
            return False
        files = STAGES[action.stage].outputs
        return download_action(self.store, self.remote, result.key, action.stage, files) is not None

    @staticmethod
    def _producer_keys(action: Action, results: dict[str, ActionResult]) -> dict[str, str | None]:
        return {
            name: results[i.action.identity].key if isinstance(i, Output) else None
            for name, i in action.inputs.items()
        }


Callback = Callable[[Action, ActionResult], None]
