"""What each target's last build did, kept so `npubuild explain` can say what changed and why."""

from __future__ import annotations

from typing import Any

from npubuild.cache.store import Store
from npubuild.engine.actions import Input, SourceFile, TargetPlan
from npubuild.engine.build import ActionResult


def _shown(value: Any) -> str:
    """A setting's value as the BUILD file would spell it, cut short when long."""
    import json

    text = "unset" if value is None else json.dumps(value, sort_keys=True)
    return text if len(text) <= 60 else text[:57] + "..."


def _param_diff(old: Any, new: Any, path: str = "") -> list[str]:
    """One line per changed setting, with its old and new value. A named whole (a hardware
    target) that changed its name is one line, not one per field that differs with it."""
    if isinstance(old, dict) and isinstance(new, dict):
        if "name" in old and "name" in new and old["name"] != new["name"]:
            return [f"{path or 'params'}: {old['name']} -> {new['name']}"]
        out: list[str] = []
        for k in sorted(set(old) | set(new)):
            out += _param_diff(old.get(k), new.get(k), f"{path}.{k}" if path else str(k))
        return out
    return [] if old == new else [f"setting {path or 'params'} changed: {_shown(old)} -> {_shown(new)}"]


def changes(previous: dict | None, current: dict) -> list[str]:
    """Why this step's key differs from the last build's, in words."""
    if previous is None:
        return ["first build of this step"]
    if previous["key"] == current["key"]:
        return []
    why = []
    if previous.get("version") != current["version"]:
        why.append(f"stage code version {previous.get('version')} -> {current['version']}")
    for name in sorted(set(previous["inputs"]) | set(current["inputs"])):
        old, new = previous["inputs"].get(name), current["inputs"].get(name)
        if old != new:
            why.append(
                f"input {current.get('input_names', {}).get(name, name)} changed "
                f"({(old or 'none')[:10]} -> {(new or 'none')[:10]})"
            )
    why += _param_diff(previous.get("params"), current["params"])
    return why or ["key changed"]


def _input_name(i: Input) -> str:
    return i.display if isinstance(i, SourceFile) else f"{i.action.owner} {i.action.stage}.{i.name}"


def record(store: Store, plans: list[TargetPlan], results: dict[str, ActionResult]) -> None:
    for plan in plans:
        steps = []
        previous = {s["step"]: s for s in (store.get_meta(f"last/{plan.label}") or {}).get("steps", [])}
        for step, action in plan.steps:
            result = results.get(action.identity)
            if result is None or not result.key:
                steps.append(
                    {
                        "step": step,
                        "stage": action.stage,
                        "status": result.status if result else "not run",
                        "message": result.message if result else "",
                    }
                )
                continue
            current = {
                "step": step,
                "stage": action.stage,
                "status": result.status,
                "key": result.key,
                "version": action.version,
                "inputs": result.inputs,
                "input_names": {n: _input_name(i) for n, i in action.inputs.items()},
                "params": action.params,
                "message": result.message,
            }
            prev = previous.get(step)
            current["why"] = changes(prev if prev and "key" in prev else None, current)
            if result.status == "ran" and not current["why"]:
                current["why"] = ["its result was not in the cache (evicted or corrupt)"]
            steps.append(current)
        store.set_meta(f"last/{plan.label}", {"steps": steps})


def last(store: Store, label: str) -> dict | None:
    return store.get_meta(f"last/{label}")
