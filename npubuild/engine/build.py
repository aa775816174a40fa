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

from npubuild.cache.store import CorruptBlob, Store
from npubuild.engine.actions import Action, Output, SourceFile

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
    ):
        self.store = store
        self.execute = execute
        self.jobs = max(1, jobs)
        self.keep_going = keep_going
        self.progress = progress or Progress()
        self._pool = None  # a ProcessPoolExecutor, made on first use

    def run(self, actions: list[Action]) -> dict[str, ActionResult]:
        """Results by action identity. Reruns a round when a worker found a corrupt cached input."""
        executed: set[str] = set()
        results: dict[str, ActionResult] = {}
        try:
            for _ in range(MAX_ROUNDS):
                results = self._round(actions, executed)
                if not any(r.status == "corrupt" for r in results.values()):
                    break
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=True, cancel_futures=True)
                self._pool = None
        for identity in executed:
            if results.get(identity) and results[identity].status == "cached":
                results[identity].status = "ran"  # it ran in an earlier round
        return results

    def _submit(self, action: Action, desc: dict) -> Future:
        from npubuild.engine.worker import execute

        if self.jobs == 1:
            future: Future = Future()
            future.set_result(execute(str(self.store.directory), desc))
            return future
        if self._pool is None:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor

            self._pool = ProcessPoolExecutor(self.jobs, mp_context=multiprocessing.get_context("spawn"))
        return self._pool.submit(execute, str(self.store.directory), desc)

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
        if hit is not None and all(self.store.has_blob(d) for d in hit["outputs"].values()):
            return ActionResult("cached", key, digests, hit["outputs"])
        return ActionResult("pending", key, digests)

    @staticmethod
    def _producer_keys(action: Action, results: dict[str, ActionResult]) -> dict[str, str | None]:
        return {
            name: results[i.action.identity].key if isinstance(i, Output) else None
            for name, i in action.inputs.items()
        }


Callback = Callable[[Action, ActionResult], None]
