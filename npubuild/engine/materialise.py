"""Copying built artifacts to `npubuild-out/<package>/<name>/`, skipping files already in place."""

from __future__ import annotations

from pathlib import Path

from npubuild.cache.store import Store


def materialise(store: Store, digest: str, dest: Path) -> bool:
    """Make dest hold the blob `digest`; True when it had to be written. Raises CorruptBlob."""
    if dest.is_file() and store.source_digest(dest) == digest:
        return False
    store.copy_to(digest, dest)
    store.remember_digest(dest, digest)
    return True
