"""Temporary directories a build makes and deletes itself (the pool workers' scratch space, a
cache that could not be written). A build killed outright (SIGKILL, the OOM killer) cannot delete
them, so each is named after its owner, npubuild-<kind>-<host>-<pid>-*, and the next build on the
same host deletes those of its kind whose owning process is gone."""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import socket
import tempfile
from collections.abc import Iterator


def owned_tempdir(kind: str) -> str:
    """A new temporary directory of this process, after deleting the orphans of its kind."""
    sweep_orphans(kind)
    return tempfile.mkdtemp(prefix=f"{_prefix(kind)}{os.getpid()}-")


@contextlib.contextmanager
def owned_scratch(kind: str) -> Iterator[str]:
    """An owned temporary directory for the length of a `with` block, deleted on leaving it;
    if the process is killed inside it, by the next build that makes one of its kind."""
    path = owned_tempdir(kind)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def sweep_orphans(kind: str) -> list[str]:
    """Delete this user's npubuild-<kind>-<host>-<pid>-* directories whose process is gone; returns
    their names. Only this host's: another host (or container) sharing the directory has its own
    process ids, which say nothing here."""
    pattern = re.compile(re.escape(_prefix(kind)) + r"(\d+)-")
    removed = []
    try:
        entries = list(os.scandir(tempfile.gettempdir()))
    except OSError:
        return removed
    for entry in entries:
        match = pattern.match(entry.name)
        if match is None or _alive(int(match[1])):
            continue
        try:
            stat = entry.stat(follow_symlinks=False)
            ours = entry.is_dir(follow_symlinks=False) and stat.st_uid == os.getuid()
        except OSError:
            ours = False
        if not ours:
            continue
        shutil.rmtree(entry.path, ignore_errors=True)
        removed.append(entry.name)
    return removed


def _prefix(kind: str) -> str:
    host = hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]
    return f"npubuild-{kind}-{host}-"


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: someone else's process, alive
        return True
    return True
