"""Runs one action description; the same code serves the local pool and Ray workers.

Inputs are read from the store (digest-checked), the stage writes into a private temp directory,
outputs go into the store and only then is the action-cache entry written: a worker killed at any
moment leaves either no entry or a complete one. With a shared remote cache, inputs this worker's
store lacks are fetched from it and the results are written to it, blobs first.
"""

from __future__ import annotations

import importlib
import sqlite3
from pathlib import Path

from npubuild.cache.remote import RemoteCache, RemoteCacheConfig
from npubuild.cache.shared import download_blob, upload_action
from npubuild.cache.store import CorruptBlob, Store
from npubuild.engine.isolated import StageFailed, failure, run_stage
from npubuild.stages import STAGES
from npubuild.tempdirs import owned_scratch

_stores: dict[str, Store] = {}
_remotes: dict[str, RemoteCache] = {}


def _store(directory: str) -> Store:
    if directory not in _stores:
        _stores[directory] = Store(Path(directory))
    return _stores[directory]


def _remote(config: dict | None) -> RemoteCache | None:
    """One client per cache and process, so its connection is reused. The builder sends a config
    only while it believes the cache is up, so a client that gave up earlier gets a fresh start."""
    if config is None:
        return None
    cfg = RemoteCacheConfig.model_validate(config)
    known = _remotes.get(cfg.url)
    if known is None or known.config != cfg or known.down is not None:
        _remotes[cfg.url] = RemoteCache(cfg)
    return _remotes[cfg.url]


def execute(store_dir: str, desc: dict, remote_config: dict | None = None) -> dict:
    """Run the action; the reply says how, plus what the remote cache did (problems, down)."""
    remote = _remote(remote_config)
    store = _store(store_dir)
    reply = _execute(store, desc, remote)
    if remote is not None:
        reply["remote_problems"], remote.problems = remote.problems, []
        reply["remote_down"] = remote.down
    return reply


def _execute(store: Store, desc: dict, remote: RemoteCache | None) -> dict:
    stage = STAGES[desc["stage"]]
    # owned: a build killed outright (-j 1 runs actions in its own process) leaves it to the next
    with owned_scratch("action") as tmp:
        inputs: dict[str, Path] = {}
        for name, digest in sorted(desc["inputs"].items()):
            dest = Path(tmp) / "in" / name.replace("/", "__")
            if remote is not None:
                download_blob(store, remote, digest)
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
            if stage.isolated:
                produced = run_stage(stage.module, stage.name, desc["params"], inputs, outdir)
            else:
                produced = importlib.import_module(stage.module).run(desc["params"], inputs, outdir)
        except StageFailed as exc:  # in the child process, said there
            return exc.reply
        except Exception as exc:
            return failure(stage.name, exc)
        if set(produced) != set(stage.outputs):
            return {
                "status": "failed",
                "message": f"internal error: stage '{stage.name}' wrote {sorted(produced)}",
            }
        try:
            outputs = {name: store.put_file(Path(path)) for name, path in sorted(produced.items())}
            entry = {"outputs": outputs, "stage": stage.name}
            store.put_action(desc["key"], entry)
        except (OSError, sqlite3.Error) as exc:
            # A full disk or a cache made read-only meanwhile: the entry is written last, so the
            # cache holds no result for this action and stays as it was.
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            return {
                "status": "failed",
                "message": f"cannot store the results in the cache {store.directory}: {why}",
            }
    if remote is not None:
        upload_action(store, remote, desc["key"], entry)
    return {"status": "ok", "outputs": outputs}
