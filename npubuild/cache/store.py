"""Artifacts by digest (`cas/`), action results by key (`ac/`), source digests by stat (`stat/`).

The key spaces mirror the Bazel HTTP cache protocol so a remote cache can serve the same entries.
Stored values are bytes, files or JSON text, never pickle. Every blob read back is checked against
its digest; a mismatch evicts it and raises CorruptBlob so the engine rebuilds it.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, BinaryIO

import diskcache

from npubuild.cache.digest import CHUNK, canonical_json, sha256_file

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


def default_cache_dir() -> Path:
    if env := os.environ.get("NPUBUILD_CACHE"):
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "npubuild"


class Store:
    def __init__(self, directory: Path):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._cache = diskcache.Cache(
            str(self.directory), size_limit=1 << 50, eviction_policy="none", timeout=60, statistics=False
        )

    def close(self) -> None:
        self._cache.close()

    # content-addressed blobs ------------------------------------------------------------------
    def has_blob(self, digest: str) -> bool:
        return f"cas/{digest}" in self._cache

    def put_file(self, path: Path) -> str:
        digest = sha256_file(path)
        if not self.has_blob(digest):
            with open(path, "rb") as f:
                self._cache.set(f"cas/{digest}", f, read=True)
        return digest

    def put_source(self, path: Path, digest: str) -> None:
        """Store a workspace file whose digest is known; refuse it if it changed meanwhile."""
        if self.has_blob(digest):
            return
        with open(path, "rb") as f:
            reader = _HashingReader(f)
            self._cache.set(f"cas/{digest}", reader, read=True)
        if reader.hexdigest() != digest:
            self.evict_blob(digest)
            raise CorruptBlob(digest, reader.hexdigest())

    def put_bytes(self, data: bytes) -> str:
        digest = hashlib.sha256(data).hexdigest()
        if not self.has_blob(digest):
            self._cache.set(f"cas/{digest}", io.BytesIO(data), read=True)
        return digest

    def _open(self, digest: str) -> BinaryIO:
        handle = self._cache.get(f"cas/{digest}", read=True)
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
        """Write the blob to dest atomically, verifying it on the way."""
        dest.parent.mkdir(parents=True, exist_ok=True)
        h = hashlib.sha256()
        fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as out, self._open(digest) as src:
                while chunk := src.read(CHUNK):
                    h.update(chunk)
                    out.write(chunk)
            if h.hexdigest() != digest:
                self.evict_blob(digest)
                raise CorruptBlob(digest, h.hexdigest())
            os.replace(tmp, dest)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)

    def evict_blob(self, digest: str) -> None:
        self._cache.delete(f"cas/{digest}")

    def blob_path(self, digest: str) -> str | None:
        """Where diskcache keeps a large blob on disk (for tests that corrupt it), else None."""
        handle = self._cache.get(f"cas/{digest}", read=True)
        if handle is None:
            return None
        name = getattr(handle, "name", None)
        handle.close()
        return name if isinstance(name, str) else None

    # action cache -----------------------------------------------------------------------------
    def get_action(self, key: str) -> dict | None:
        text = self._cache.get(f"ac/{key}")
        return json.loads(text) if isinstance(text, str) else None

    def put_action(self, key: str, result: dict) -> None:
        self._cache.set(f"ac/{key}", canonical_json(result))

    def delete_action(self, key: str) -> None:
        self._cache.delete(f"ac/{key}")

    # stat cache: source digests without re-reading unchanged files ---------------------------
    def source_digest(self, path: Path) -> str:
        st = os.stat(path)
        stamp = f"{st.st_size}:{st.st_mtime_ns}:{st.st_ino}"
        entry_key = f"stat/{os.path.abspath(path)}"
        entry = self._cache.get(entry_key)
        if isinstance(entry, str):
            recorded_stamp, digest = entry.rsplit("|", 1)
            if recorded_stamp == stamp:
                return digest
        digest = sha256_file(path)
        if time.time_ns() - st.st_mtime_ns > _RACY_NS:
            self._cache.set(entry_key, f"{stamp}|{digest}")
        return digest

    def remember_digest(self, path: Path, digest: str) -> None:
        """Record the digest of a file we just wrote and verified ourselves (no racy window)."""
        st = os.stat(path)
        self._cache.set(
            f"stat/{os.path.abspath(path)}", f"{st.st_size}:{st.st_mtime_ns}:{st.st_ino}|{digest}"
        )

    # small metadata (last-build records for `explain`) ---------------------------------------
    def get_meta(self, name: str) -> Any:
        text = self._cache.get(f"meta/{name}")
        return json.loads(text) if isinstance(text, str) else None

    def set_meta(self, name: str, value: Any) -> None:
        text = canonical_json(value)
        if self._cache.get(f"meta/{name}") != text:
            self._cache.set(f"meta/{name}", text)

    # least-recently-used bookkeeping and garbage collection -----------------------------------
    def touch_actions(self, keys: list[str], now: float | None = None) -> None:
        """Record that these action results were used (built or reused) by a build."""
        stamp = int(time.time() if now is None else now)
        stale = []
        for key in keys:
            used = self._cache.get(f"used/{key}")
            if not isinstance(used, int) or abs(stamp - used) >= USE_RESOLUTION_S:
                stale.append(key)
        if stale:
            with self._cache.transact():
                for key in stale:
                    self._cache.set(f"used/{key}", stamp)

    def blob_size(self, digest: str) -> int | None:
        handle = self._cache.get(f"cas/{digest}", read=True)
        if handle is None:
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
                    used = self._cache.get(f"used/{key[3:]}")
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
        shutil.rmtree(self.directory, ignore_errors=True)
