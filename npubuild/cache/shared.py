"""Moving action results between the local store and the shared remote cache.

Blobs go up before the action entry that names them, so a reader never finds an entry whose outputs
are missing; coming down, every blob is verified before it enters the local store and the local
action entry is written last.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from npubuild.cache.store import CorruptBlob, Store, is_result_of

if TYPE_CHECKING:  # the client imports pydantic, which a no-op build never needs
    from npubuild.cache.remote import RemoteCache


def download_action(
    store: Store, remote: RemoteCache, key: str, stage: str, files: dict[str, str]
) -> dict | None:
    """Copy action `key`'s result and its output blobs into the local store; None if unavailable.
    `stage` and `files` (output name -> file name) are what the action writes: an entry naming
    anything else, or a JSON output that does not parse, is rejected before anything is stored."""
    entry = remote.get_action(key)
    if entry is None:
        return None
    if not is_result_of(entry, stage, files):
        remote.reject_action(key, f"is not a result of stage '{stage}' (outputs {sorted(entry['outputs'])})")
        return None
    sizes = entry.get("sizes") or {}
    for name, digest in sorted(entry["outputs"].items()):
        if not download_blob(store, remote, digest, sizes.get(name)):
            return None
        if files[name].endswith(".json") and not _is_json(store, digest):
            remote.reject_action(key, f"output '{name}' is not JSON")
            store.evict_blob(digest)
            return None
    result = {"stage": entry["stage"], "outputs": entry["outputs"]}
    store.put_action(key, result)
    return result


def _is_json(store: Store, digest: str) -> bool:
    try:
        json.loads(store.read_bytes(digest))
    except (ValueError, CorruptBlob, KeyError):
        return False
    return True


def download_blob(store: Store, remote: RemoteCache, digest: str, size: int | None = None) -> bool:
    """Bring one blob into the local store, streamed through a file in the cache directory (never
    whole in memory) and verified before it is stored."""
    if store.has_blob(digest):
        return True
    with tempfile.NamedTemporaryFile(dir=store.directory, prefix=".download-") as part:
        if not remote.get_blob(digest, part, size):
            return False
        part.flush()
        store.put_source(Path(part.name), digest)
    return True


def upload_action(store: Store, remote: RemoteCache, key: str, entry: dict) -> None:
    """Write an action's output blobs, then its entry. The blobs are written even when the remote
    has them: what it has may be the wrong bytes that made this action run here."""
    if not remote.writable:
        return
    for digest in sorted(set(entry["outputs"].values())):
        upload_blob(store, remote, digest, check_first=False)
    sizes = {name: store.blob_size(digest) for name, digest in entry["outputs"].items()}
    remote.put_action(key, entry, sizes if None not in sizes.values() else None)


def upload_blob(store: Store, remote: RemoteCache, digest: str, check_first: bool = True) -> None:
    if not remote.writable or (check_first and remote.has_blob(digest)):
        return
    try:
        data = store.read_bytes(digest)
    except (CorruptBlob, KeyError):
        return  # unreadable here: never send bytes we could not verify
    remote.put_blob(digest, data)
