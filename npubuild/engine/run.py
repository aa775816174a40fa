"""One build from patterns to materialised outputs: load, plan, run, materialise, record."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from npubuild.cache.store import CorruptBlob, Store
from npubuild.engine import history
from npubuild.engine.actions import Action, TargetPlan
from npubuild.engine.analysis import analyse
from npubuild.engine.build import ActionResult, Builder, Progress
from npubuild.engine.materialise import materialise
from npubuild.layout import OUT_DIR


@dataclass
class BuildOutcome:
    plans: list[TargetPlan]
    actions: list[Action]
    results: dict[str, ActionResult]
    seconds: float
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)  # the cache's and the remote cache's, one line each

    @property
    def ok(self) -> bool:
        return not self.errors

    def executed(self) -> set[tuple[str, str]]:
        """(stage, owner) of every action that ran; what the edit-scenario tests assert."""
        return {(a.stage, a.owner) for a in self.actions if self.results[a.identity].status == "ran"}

    def result(self, action: Action) -> ActionResult:
        return self.results[action.identity]


def build(
    root: Path,
    store: Store,
    patterns: list[str],
    *,
    jobs: int = 1,
    keep_going: bool = False,
    until: str | None = None,
    progress: Progress | None = None,
    execute: bool = True,
    remote=None,
    executor=None,
) -> BuildOutcome:
    """Build the patterns. With execute=False, raise NeedsExecution instead of running anything.
    `remote` is a RemoteCache shared with other machines; `executor` runs actions elsewhere (Ray)."""
    started = time.perf_counter()
    plans, actions = analyse(root, store, patterns, until, fresh_allowed=execute)
    builder = Builder(
        store,
        jobs=jobs,
        keep_going=keep_going,
        progress=progress,
        execute=execute,
        remote=remote,
        executor=executor,
    )
    results = builder.run(actions)
    # A blob can turn out corrupt only when read: materialising reads it; rebuild what was bad.
    unwritable: list[str] = []
    for attempt in range(3):
        bad, unwritable = _materialise_all(root, store, plans, results)
        if not bad or attempt == 2:
            break
        for action in bad:
            store.delete_action(results[action.identity].key)
        earlier, results = results, builder.run(actions)
        for identity, r in earlier.items():
            if r.status == "ran" and results[identity].status == "cached":
                results[identity].status = "ran"
    history.record(store, plans, results)
    store.touch_actions(sorted(r.key for r in results.values() if r.ok and r.key))
    errors = list(unwritable)
    for action in bad:
        errors.append(
            f"{action.stage} {action.owner}: an output could not be read back from the cache even "
            "after rebuilding it; check the cache directory (disk errors?) or run 'npubuild clean --expunge'"
        )
    for action in actions:
        r = results[action.identity]
        if r.status == "failed":
            where = f"{action.location}: " if action.location else ""
            errors.append(f"{where}{action.stage} {action.owner}: {r.message}")
        elif r.status == "corrupt":
            errors.append(f"{action.stage} {action.owner}: {r.message} (still corrupt after a rebuild)")
    seconds = time.perf_counter() - started
    notes = [*store.warnings, *builder.remote_notes]
    return BuildOutcome(plans, actions, results, seconds, errors, notes)


def _materialise_all(
    root: Path, store: Store, plans: list[TargetPlan], results: dict
) -> tuple[list[Action], list[str]]:
    """(actions whose outputs were missing or corrupt in the cache, errors writing the outputs)."""
    bad: list[Action] = []
    unwritable: list[str] = []
    for plan in plans:
        out = root / OUT_DIR / plan.label.out_dir
        for action, output, filename in plan.outputs:
            result = results.get(action.identity)
            if result is None or not result.ok:
                continue
            dest = out / filename
            try:
                materialise(store, result.outputs[output], dest)
            except (CorruptBlob, KeyError):
                if action not in bad:
                    bad.append(action)
            except OSError as exc:  # npubuild-out or a folder in it is a file, a full disk, ...
                where = exc.filename or dest
                unwritable.append(
                    f"cannot write the output {dest.relative_to(root)} of {plan.label}: "
                    f"{exc.strerror or exc} ({where})"
                )
                break  # one line per target: its other outputs fail the same way
    return bad, unwritable
