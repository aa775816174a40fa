"""Analysis (BUILD files -> targets -> actions), cached so an unchanged workspace skips it.

The cached analysis is trusted only while everything it read is unchanged: the BUILD files it
loaded (digests via the stat cache), the package list when a recursive pattern walked the tree,
every glob's matches, the source files its actions read, and npubuild's own code. Checking that
needs no pydantic models and no BUILD evaluation, which is what keeps a no-op build fast.
"""

from __future__ import annotations

import os
from pathlib import Path

from npubuild.cache.digest import sha256_json
from npubuild.cache.store import Store
from npubuild.engine.actions import Action, Output, SourceFile, TargetPlan
from npubuild.errors import Location
from npubuild.labels import parse_label
from npubuild.layout import glob_files, list_packages, package_dir
from npubuild.stages import codeversion


def _record_name(root: Path, patterns: list[str], until: str | None) -> str:
    return "analysis/" + sha256_json({"root": str(root), "patterns": patterns, "until": until})


def analyse(
    root: Path, store: Store, patterns: list[str], until: str | None, fresh_allowed: bool = True
) -> tuple[list[TargetPlan], list[Action]]:
    """The plans and actions for the patterns, from the cache when nothing they read changed."""
    name = _record_name(root, patterns, until)
    stamp = codeversion.current_stamp()
    codeversion.versions(store)  # the stages' code versions for this tree, computed once per tree
    record = store.get_meta(name)
    if record is not None and record.get("tool") == stamp and _still_valid(root, store, record):
        return _decode(record)
    if not fresh_allowed:
        from npubuild.engine.build import NeedsExecution

        raise NeedsExecution("analysis")
    from npubuild.engine.plan import ordered_actions, plan_targets
    from npubuild.workspace import Workspace

    workspace = Workspace(root)
    plans = plan_targets(workspace, patterns, until)
    actions = ordered_actions(plans)
    store.set_meta(name, _encode(root, store, workspace, plans, actions, stamp))
    return plans, actions


def _still_valid(root: Path, store: Store, record: dict) -> bool:
    try:
        for rel, digest in record["build_files"].items():
            if store.source_digest(root / rel) != digest:
                return False
        if record["packages"] is not None and list_packages(root) != record["packages"]:
            return False
        for package, include, exclude, found in record["globs"]:
            if glob_files(package_dir(root, package), include, exclude) != found:
                return False
        return all(os.path.isfile(p) for p in record["sources"])
    except Exception:  # anything odd (a vanished file, a bad glob): analyse afresh and report properly
        return False


def _encode(
    root: Path, store: Store, workspace, plans: list[TargetPlan], actions: list[Action], stamp: str
) -> dict:
    index = {a.identity: i for i, a in enumerate(actions)}

    def encode_input(i):
        if isinstance(i, SourceFile):
            return ["src", str(i.path), i.display]
        return ["out", index[i.action.identity], i.name]

    return {
        "tool": stamp,
        "build_files": {rel: store.source_digest(root / rel) for rel in workspace.loaded_build_files},
        "packages": workspace.all_packages() if workspace.walked else None,
        "globs": workspace.globs,
        "sources": sorted(
            {str(i.path) for a in actions for i in a.inputs.values() if isinstance(i, SourceFile)}
        ),
        "actions": [
            {
                "stage": a.stage,
                "params": a.params,
                "inputs": {n: encode_input(i) for n, i in a.inputs.items()},
                "owner": a.owner,
                "location": [a.location.path, a.location.line, a.location.col] if a.location else None,
            }
            for a in actions
        ],
        "plans": [
            {
                "label": str(p.label),
                "kind": p.kind,
                "steps": [[step, index[a.identity]] for step, a in p.steps],
                "outputs": [[index[a.identity], output, filename] for a, output, filename in p.outputs],
                "notes": p.notes,
                "gates": p.gates,
            }
            for p in plans
        ],
    }


def _decode(record: dict) -> tuple[list[TargetPlan], list[Action]]:
    actions: list[Action] = []
    for a in record["actions"]:
        inputs = {
            n: SourceFile(Path(ref[1]), ref[2]) if ref[0] == "src" else Output(actions[ref[1]], ref[2])
            for n, ref in a["inputs"].items()
        }
        location = Location(*a["location"]) if a["location"] else None
        actions.append(Action(a["stage"], a["params"], inputs, a["owner"], location))
    plans = [
        TargetPlan(
            parse_label(p["label"]),
            p["kind"],
            [(step, actions[i]) for step, i in p["steps"]],
            [(actions[i], output, filename) for i, output, filename in p["outputs"]],
            list(p.get("notes", [])),
            dict(p.get("gates", {})),
        )
        for p in record["plans"]
    ]
    return plans, actions
