"""Moving action results between the local store and the shared remote cache.

Blobs go up before the action entry that names them, so a reader never finds an entry whose outputs
are missing; coming down, every blob is verified before it enters the local store and the local
action entry is written last.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from npubuild.cache.store import CorruptBlob, Store

if TYPE_CHECKING:  # the client imports pydantic, which a no-op build never needs
    from npubuild.cache.remote import RemoteCache


def download_action(store: Store, remote: RemoteCache, key: str) -> dict | None:
    """Copy action `key`'s result and its output blobs into the local store; None if unavailable."""
    entry = remote.get_action(key)
    if entry is None:
        return None
    for digest in sorted(set(entry["outputs"].values())):
        if not download_blob(store, remote, digest):
            return None
    store.put_action(key, entry)
    return entry


def download_blob(store: Store, remote: RemoteCache, digest: str) -> bool:
    if store.has_blob(digest):
        return True
    data = remote.get_blob(digest)
    if data is None:
        return False
    store.put_bytes(data)
    return True


def upload_action(store: Store, remote: RemoteCache, key: str, entry: dict) -> None:
    """Write an action's output blobs, then its entry. The blobs are written even when the remote
    has them: what it has may be the wrong bytes that made this action run here."""
    if not remote.writable:
        return
    for digest in sorted(set(entry["outputs"].values())):
        upload_blob(store, remote, digest, check_first=False)
    remote.put_action(key, entry)


def upload_blob(store: Store, remote: RemoteCache, digest: str, check_first: bool = True) -> None:
    if not remote.writable or (check_first and remote.has_blob(digest)):
        return
    try:
        data = store.read_bytes(digest)
    except (CorruptBlob, KeyError):
        return  # unreadable here: never send bytes we could not verify
    remote.put_blob(digest, data)
