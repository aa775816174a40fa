"""Runs one action description; the same code serves the local pool and, later, remote workers.

Inputs are read from the store (digest-checked), the stage writes into a private temp directory,
outputs go into the store and only then is the action-cache entry written: a worker killed at any
moment leaves either no entry or a complete one.
"""

from __future__ import annotations

import importlib
import tempfile
import traceback
from pathlib import Path

from npubuild.cache.store import CorruptBlob, Store
from npubuild.errors import UserError
from npubuild.stages import STAGES

_stores: dict[str, Store] = {}


def _store(directory: str) -> Store:
    if directory not in _stores:
        _stores[directory] = Store(Path(directory))
    return _stores[directory]


def execute(store_dir: str, desc: dict) -> dict:
    store = _store(store_dir)
    stage = STAGES[desc["stage"]]
    with tempfile.TemporaryDirectory(prefix=f"npubuild-{stage.name}-") as tmp:
        inputs: dict[str, Path] = {}
        for name, digest in sorted(desc["inputs"].items()):
            dest = Path(tmp) / "in" / name.replace("/", "__")
            try:
                store.copy_to(digest, dest)
            except (CorruptBlob, KeyError):
                # The producer's cache entry points at bytes we no longer have: forget it so the
                # engine reruns the producer, then this action.
                producer = desc["producers"].get(name)
                if producer:
                    store.delete_action(producer)
                return {
                    "status": "corrupt",
                    "message": f"input '{name}' ({digest[:12]}) was missing or corrupt",
                }
            inputs[name] = dest
        outdir = Path(tmp) / "out"
        outdir.mkdir()
        try:
            module = importlib.import_module(stage.module)
            produced = module.run(desc["params"], inputs, outdir)
        except UserError as exc:
            return {"status": "failed", "message": str(exc)}
        except Exception as exc:  # a bug of ours: say so in one line, keep the trace for --verbose
            return {
                "status": "failed",
                "message": f"internal error in stage '{stage.name}': {type(exc).__name__}: {exc}",
                "traceback": traceback.format_exc(),
            }
        if set(produced) != set(stage.outputs):
            return {
                "status": "failed",
                "message": f"internal error: stage '{stage.name}' wrote {sorted(produced)}",
            }
        outputs = {name: store.put_file(Path(path)) for name, path in sorted(produced.items())}
    store.put_action(desc["key"], {"outputs": outputs, "stage": stage.name})
    return {"status": "ok", "outputs": outputs}
