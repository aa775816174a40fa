"""Artifacts by digest (`cas/`), action results by key (`ac/`), source digests by stat (`stat/`).

The key spaces mirror the Bazel HTTP cache protocol so a remote cache can serve the same entries.
Stored values are bytes, files or JSON text, never pickle. Every blob read back is checked against
its digest; a mismatch evicts it and raises CorruptBlob so the engine rebuilds it.

The store claims only what it can show: a blob is present when its file is there with the size
recorded beside it, an index row that does not parse is dropped (and rebuilt by the build), a
damaged database file is set aside, and a cache directory that cannot be written makes the build
run without a cache. Each of these leaves one line in `warnings` for the command line to print.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import sqlite3
import tempfile
import time
from pathlib import Path
from typing import Any, BinaryIO

import diskcache

from npubuild.cache.digest import CHUNK, SHA256_HEX, canonical_json, sha256_file
from npubuild.tempdirs import owned_tempdir


def _read_umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


_UMASK = _read_umask()


def _remove_orphans(dest: Path) -> None:
    """Delete the temporary files of earlier writes of dest (`.NAME.PID.*.tmp`) whose writer is no
    longer running (a build killed mid-copy); a live writer's file is left to it."""
    prefix = f".{dest.name}."
    try:
        names = os.listdir(dest.parent)
    except OSError:
        return
    for name in names:
        if not (name.startswith(prefix) and name.endswith(".tmp")):
            continue
        pid = name[len(prefix) :].split(".", 1)[0]
        if not pid.isdigit() or int(pid) == os.getpid() or _running(int(pid)):
            continue
        try:
            os.unlink(dest.parent / name)
        except OSError:
            pass


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process: running
        return True
    return True


# Last-use times of action results are kept to this resolution, so that a no-op build a minute after
# the last one writes nothing; `cache gc` evicts least recently used first.
USE_RESOLUTION_S = 3600

# A file modified this recently may change again within the same mtime tick, so its stat entry is
# not trusted ("racily clean", as git calls it): its digest is recomputed next time.
_RACY_NS = 2_000_000_000


class CorruptBlob(Exception):
    def __init__(self, digest: str, actual: str):
        super().__init__(f"artifact {digest[:12]} is corrupt in the cache (content hashes to {actual[:12]})")
        self.digest = digest


class _HashingReader:
    def __init__(self, f: BinaryIO):
        self._f = f
        self._h = hashlib.sha256()

    def read(self, size: int = -1) -> bytes:
        chunk = self._f.read(size)
        self._h.update(chunk)
        return chunk

    def hexdigest(self) -> str:
        return self._h.hexdigest()


class _NoPickleDisk(diskcache.Disk):
    """diskcache's storage, refusing to unpickle: a tampered cache.db must not run code."""

    def fetch(self, mode, filename, value, read):
        if mode == diskcache.core.MODE_PICKLE:
            raise ValueError("a pickled value in the cache index")
        return super().fetch(mode, filename, value, read)


def valid_action_entry(entry: Any) -> bool:
    """An action-cache entry as the engine writes it: a stage name and sha256 digests by output."""
    return (
        isinstance(entry, dict)
        and isinstance(entry.get("stage"), str)
        and isinstance(entry.get("outputs"), dict)
        and all(
            isinstance(k, str) and isinstance(v, str) and SHA256_HEX.match(v)
            for k, v in entry["outputs"].items()
        )
    )


def is_result_of(entry: dict, stage: str, outputs) -> bool:
    """A valid entry of exactly this stage's outputs (not another stage's, not hand-made names)."""
    return entry["stage"] == stage and set(entry["outputs"]) == set(outputs)


def default_cache_dir() -> Path:
    if env := os.environ.get("NPUBUILD_CACHE"):
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "npubuild"


class Store:
    def __init__(self, directory: Path):
        self.directory = Path(directory)
        self.warnings: list[str] = []  # one line each: what was repaired or given up
        self._temporary: str | None = None
        self._cache = self._open_index()

    def _open_index(self) -> diskcache.Cache:
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            return self._diskcache(self.directory)
        except sqlite3.DatabaseError as exc:
            if isinstance(exc, sqlite3.OperationalError) and not _damaged(exc):
                return self._without_cache(str(exc))
            # Not a database (truncated, overwritten): keep it for a post-mortem, start afresh.
            aside = self.directory / f"cache.db.damaged-{os.getpid()}"
            try:
                os.replace(self.directory / "cache.db", aside)
                for suffix in ("-wal", "-shm"):
                    if (self.directory / f"cache.db{suffix}").exists():
                        os.unlink(self.directory / f"cache.db{suffix}")
                cache = self._diskcache(self.directory)
            except (OSError, sqlite3.Error) as again:
                return self._without_cache(str(again))
            self.warnings.append(
                f"the cache index {self.directory / 'cache.db'} was damaged ({exc}); "
                f"set aside as {aside.name}, starting with an empty cache"
            )
            return cache
        except OSError as exc:
            return self._without_cache(exc.strerror or str(exc))

    @staticmethod
    def _diskcache(directory: Path) -> diskcache.Cache:
        return diskcache.Cache(
            str(directory),
            size_limit=1 << 50,
            eviction_policy="none",
            timeout=60,
            statistics=False,
            disk=_NoPickleDisk,
        )

    def _without_cache(self, why: str) -> diskcache.Cache:
        """The cache directory cannot be written: build in a private one, deleted on close."""
        self._temporary = owned_tempdir("nocache")
        self.warnings.append(f"cannot use the cache {self.directory} ({why}); building without a cache")
        self.directory = Path(self._temporary)  # what workers open too
        return self._diskcache(self.directory)

    def close(self) -> None:
        self._cache.close()
        if self._temporary is not None:
            shutil.rmtree(self._temporary, ignore_errors=True)

    def _warn_once(self, line: str) -> None:
        if line not in self.warnings:
            self.warnings.append(line)

    def _get_text(self, key: str) -> str | None:
        """A text row; a row that cannot be read back (lost file, a pickle, garbage) is dropped."""
        try:
            value = self._cache.get(key)
        except (ValueError, OSError, UnicodeDecodeError, sqlite3.DataError):
            value = 0
        if value is None or isinstance(value, str):
            return value
        self._drop_damaged(key)
        return None

    def _get_int(self, key: str) -> int | None:
        try:
            value = self._cache.get(key)
        except (ValueError, OSError):
            value = None
        return value if isinstance(value, int) else None

    def _drop_damaged(self, key: str) -> None:
        self._cache.delete(key)
        self._warn_once(f"the cache had damaged entries (first: {key[:20]}…); dropped, rebuilt as needed")

    # content-addressed blobs ------------------------------------------------------------------
    def has_blob(self, digest: str) -> bool:
        """True only when the blob's file is there with the size it was stored with; a row whose
        file is gone (a tmp cleaner, a manual delete) is dropped, so the blob is stored again."""
        key = f"cas/{digest}"
        try:
            handle, size = self._cache.get(key, read=True, tag=True)
        except (ValueError, OSError):
            handle, size = None, None
        if handle is None:
            if key in self._cache:
                self._cache.delete(key)
            return False
        with handle:
            actual = handle.seek(0, io.SEEK_END)
        if isinstance(size, int) and actual != size:
            self._cache.delete(key)
            return False
        return True

    def _set_blob(self, digest: str, reader, size: int) -> None:
        self._cache.set(f"cas/{digest}", reader, read=True, tag=size)

    def put_file(self, path: Path) -> str:
        digest = sha256_file(path)
        if not self.has_blob(digest):
            with open(path, "rb") as f:
                self._set_blob(digest, f, os.fstat(f.fileno()).st_size)
        return digest

    def put_source(self, path: Path, digest: str) -> None:
        """Store a file whose digest is known (a workspace source, a download), hashing it on the
        way in: one that changed meanwhile or holds other bytes is refused (CorruptBlob)."""
        if self.has_blob(digest):
            return
        with open(path, "rb") as f:
            reader = _HashingReader(f)
            self._set_blob(digest, reader, os.fstat(f.fileno()).st_size)
        if reader.hexdigest() != digest:
            self.evict_blob(digest)
            raise CorruptBlob(digest, reader.hexdigest())

    def put_bytes(self, data: bytes) -> str:
        digest = hashlib.sha256(data).hexdigest()
        if not self.has_blob(digest):
            self._set_blob(digest, io.BytesIO(data), len(data))
        return digest

    def _open(self, digest: str) -> BinaryIO:
        try:
            handle = self._cache.get(f"cas/{digest}", read=True)
        except (ValueError, OSError):
            handle = None
        if handle is None:
            raise KeyError(digest)
        return handle

    def read_bytes(self, digest: str) -> bytes:
        with self._open(digest) as f:
            data = f.read()
        actual = hashlib.sha256(data).hexdigest()
        if actual != digest:
            self.evict_blob(digest)
            raise CorruptBlob(digest, actual)
        return data

    def read_json(self, digest: str) -> Any:
        return json.loads(self.read_bytes(digest))

    def copy_to(self, digest: str, dest: Path) -> None:
        """Write the blob to dest atomically, verifying it on the way. The temporary file names
        its writer's process, so that the next write of dest removes one a killed build left."""
        dest.parent.mkdir(parents=True, exist_ok=True)
        _remove_orphans(dest)
        h = hashlib.sha256()
        fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.{os.getpid()}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as out, self._open(digest) as src:
                while chunk := src.read(CHUNK):
                    h.update(chunk)
                    out.write(chunk)
            if h.hexdigest() != digest:
                self.evict_blob(digest)
                raise CorruptBlob(digest, h.hexdigest())
            os.chmod(tmp, 0o666 & ~_UMASK)  # as if created with open(): mkstemp makes it 0600
            os.replace(tmp, dest)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)

    def evict_blob(self, digest: str) -> None:
        self._cache.delete(f"cas/{digest}")

    def blob_path(self, digest: str) -> str | None:
        """Where diskcache keeps a large blob on disk (for tests that corrupt it), else None."""
        try:
            handle = self._open(digest)
        except KeyError:
            return None
        name = getattr(handle, "name", None)
        handle.close()
        return name if isinstance(name, str) else None

    # action cache -----------------------------------------------------------------------------
    def get_action(self, key: str) -> dict | None:
        """The action's recorded result, or None; an entry that is not one is dropped."""
        text = self._get_text(f"ac/{key}")
        if text is None:
            return None
        try:
            entry = json.loads(text)
        except ValueError:
            entry = None
        if not valid_action_entry(entry):
            self._drop_damaged(f"ac/{key}")
            return None
        return entry

    def put_action(self, key: str, result: dict) -> None:
        self._cache.set(f"ac/{key}", canonical_json(result))

    def delete_action(self, key: str) -> None:
        self._cache.delete(f"ac/{key}")

    # stat cache: source digests without re-reading unchanged files ---------------------------
    def source_digest(self, path: Path) -> str:
        st = os.stat(path)
        stamp = _stat_stamp(st)
        entry_key = f"stat/{os.path.abspath(path)}"
        entry = self._get_text(entry_key)
        if entry is not None:
            recorded_stamp, _, digest = entry.rpartition("|")
            if recorded_stamp == stamp and SHA256_HEX.match(digest):
                return digest
        digest = sha256_file(path)
        if time.time_ns() - st.st_mtime_ns > _RACY_NS:
            self._cache.set(entry_key, f"{stamp}|{digest}")
        return digest

    def remember_digest(self, path: Path, digest: str) -> None:
        """Record the digest of a file we just wrote and verified ourselves (no racy window)."""
        self._cache.set(f"stat/{os.path.abspath(path)}", f"{_stat_stamp(os.stat(path))}|{digest}")

    # small metadata (last-build records for `explain`) ---------------------------------------
    def get_meta(self, name: str) -> Any:
        """A metadata record, or None; a record that does not parse is dropped."""
        text = self._get_text(f"meta/{name}")
        if text is None:
            return None
        try:
            return json.loads(text)
        except ValueError:
            self._drop_damaged(f"meta/{name}")
            return None

    def set_meta(self, name: str, value: Any) -> None:
        text = canonical_json(value)
        if self._get_text(f"meta/{name}") != text:
            self._cache.set(f"meta/{name}", text)

    # least-recently-used bookkeeping and garbage collection -----------------------------------
    def touch_actions(self, keys: list[str], now: float | None = None) -> None:
        """Record that these action results were used (built or reused) by a build."""
        stamp = int(time.time() if now is None else now)
        stale = []
        for key in keys:
            used = self._get_int(f"used/{key}")
            if not isinstance(used, int) or abs(stamp - used) >= USE_RESOLUTION_S:
                stale.append(key)
        if stale:
            with self._cache.transact():
                for key in stale:
                    self._cache.set(f"used/{key}", stamp)

    def blob_size(self, digest: str) -> int | None:
        try:
            handle = self._open(digest)
        except KeyError:
            return None
        with handle:
            return handle.seek(0, io.SEEK_END)

    def gc(self, max_bytes: int) -> dict[str, int]:
        """Keep the most recently used action results whose artifacts fit in max_bytes; evict the
        other results and every artifact no kept result names (source copies included: a build
        stores them again). Each artifact is counted once, however many results share it."""
        entries, sizes = [], {}
        for key in list(self._cache.iterkeys()):
            if not isinstance(key, str):
                continue
            if key.startswith("ac/"):
                result = self.get_action(key[3:])
                if result is not None:
                    used = self._get_int(f"used/{key[3:]}")
                    entries.append((used if isinstance(used, int) else 0, key[3:], result["outputs"]))
            elif key.startswith("cas/"):
                size = self.blob_size(key[4:])
                if size is not None:
                    sizes[key[4:]] = size
        entries.sort(key=lambda e: (-e[0], e[1]))
        kept_blobs: set[str] = set()
        kept_bytes, kept, evicted = 0, 0, []
        for index, (_, _, outputs) in enumerate(entries):
            new = set(outputs.values()) - kept_blobs
            extra = sum(sizes.get(d, 0) for d in new)
            if kept_bytes + extra > max_bytes:
                evicted = [e[1] for e in entries[index:]]  # strict LRU: everything older goes too
                break
            kept_blobs |= new
            kept_bytes += extra
            kept += 1
        for key in evicted:
            self._cache.delete(f"ac/{key}")
            self._cache.delete(f"used/{key}")
        dropped = [d for d in sizes if d not in kept_blobs]
        for digest in dropped:
            self.evict_blob(digest)
        return {
            "actions_kept": kept,
            "actions_evicted": len(evicted),
            "blobs_evicted": len(dropped),
            "bytes_kept": kept_bytes,
            "bytes_evicted": sum(sizes[d] for d in dropped),
        }

    # maintenance ------------------------------------------------------------------------------
    def stats(self) -> dict[str, int]:
        counts = {"cas": 0, "ac": 0, "stat": 0, "meta": 0}
        for key in self._cache.iterkeys():
            prefix = key.split("/", 1)[0] if isinstance(key, str) else ""
            if prefix in counts:
                counts[prefix] += 1
        counts["bytes"] = self._cache.volume()
        return counts

    def clear(self) -> None:
        self._cache.clear()

    def expunge(self) -> None:
        self.close()
        expunge(self.directory)


def expunge(directory: Path) -> None:
    """Delete a cache directory without opening it, so that a damaged one goes too."""
    shutil.rmtree(directory, ignore_errors=True)


def _stat_stamp(st: os.stat_result) -> str:
    """What identifies a file's version without reading it: an in-place edit that restores the
    mtime still moves the ctime, a replaced file has a new inode."""
    return f"{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}:{st.st_ino}"


def _damaged(exc: sqlite3.OperationalError) -> bool:
    """An OperationalError that says the file is not a usable database (rather than unwritable)."""
    text = str(exc).lower()
    return "malformed" in text or "not a database" in text or "file is encrypted" in text
