"""A client for a shared cache that speaks the Bazel HTTP cache protocol.

GET/PUT/HEAD `<base>/ac/<sha256>` (action results, our JSON) and `<base>/cas/<sha256>` (blobs);
404 is a miss. bazel-remote (with `--disable_http_ac_validation`, since our action entries are JSON,
not Bazel's ActionResult protobuf) and nginx with WebDAV serve it.

Nothing read from the remote is trusted: a blob must hash to its name, an action entry must name its
own key and list well-formed output digests. A bad entry is reported and treated as a miss, so the
action is rebuilt locally (and, in read-write mode, the good bytes are written over the bad ones).
One connection is kept open and reused; a failed request is retried, and when the cache cannot be
reached at all the client marks itself down and every later call is a quiet miss: the build goes on
with the local cache only.
"""

from __future__ import annotations

import hashlib
import http.client
import re
import time
from typing import Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, Field, field_validator

from npubuild.cache.digest import canonical_json
from npubuild.errors import UserError

_SHA256 = re.compile(r"^[0-9a-f]{64}$")


class RemoteCacheConfig(BaseModel):
    """What a worker needs to reach the shared cache; plain JSON so it travels with an action."""

    url: str
    mode: Literal["readwrite", "read"] = "readwrite"
    timeout_s: float = Field(10.0, gt=0)
    retries: int = Field(2, ge=0)

    @field_validator("url")
    @classmethod
    def _http_url(cls, url: str) -> str:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"remote cache must be an http:// or https:// URL, not '{url}'")
        return url.rstrip("/")


def config_from_cli(url: str, mode: str) -> RemoteCacheConfig:
    from pydantic import ValidationError

    try:
        return RemoteCacheConfig(url=url, mode=mode)
    except ValidationError as exc:
        raise UserError(f"--remote-cache: {exc.errors()[0]['msg']}") from None


class RemoteDown(Exception):
    """The remote cache could not be reached after the retries."""


class _ActionEntry(BaseModel):
    key: str
    stage: str
    outputs: dict[str, str]


class RemoteCache:
    def __init__(self, config: RemoteCacheConfig):
        self.config = config
        parts = urlsplit(config.url)
        self._https = parts.scheme == "https"
        self._host = parts.hostname or ""
        self._port = parts.port
        self._base = parts.path.rstrip("/")
        self._conn: http.client.HTTPConnection | None = None
        self.down: str | None = None  # why the cache was given up, once it was
        self.problems: list[str] = []  # bad entries seen, one line each, for the build to report
        self._bad: set[str] = set()  # remote paths known to hold wrong bytes: overwrite them
        self.requests = 0

    @property
    def writable(self) -> bool:
        return self.config.mode == "readwrite" and self.down is None

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    # transport --------------------------------------------------------------------------------
    def _connection(self) -> http.client.HTTPConnection:
        if self._conn is None:
            cls = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
            self._conn = cls(self._host, self._port, timeout=self.config.timeout_s)
        return self._conn

    def _request(self, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
        """(status, body). Retries connection errors and 5xx; raises RemoteDown when all failed."""
        if self.down is not None:
            raise RemoteDown(self.down)
        headers = {"Content-Length": str(len(body))} if body is not None else {}
        last = ""
        for attempt in range(self.config.retries + 1):
            if attempt:
                time.sleep(0.1 * 2 ** (attempt - 1))
            try:
                conn = self._connection()
                conn.request(method, f"{self._base}/{path}", body=body, headers=headers)
                response = conn.getresponse()
                data = response.read()
                self.requests += 1
                if response.will_close:
                    self.close()
                if response.status >= 500:
                    last = f"HTTP {response.status} {response.reason}"
                    continue
                return response.status, data
            except (OSError, http.client.HTTPException) as exc:
                # A kept-alive connection the server closed fails once; a fresh one then works.
                self.close()
                last = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        self.down = f"{self.config.url} unreachable ({last})"
        raise RemoteDown(self.down)

    def _read(self, method: str, path: str) -> tuple[int, bytes]:
        """A GET or HEAD; a cache that is down answers as a miss (status 0)."""
        try:
            return self._request(method, path)
        except RemoteDown:
            return 0, b""

    # action cache -----------------------------------------------------------------------------
    def get_action(self, key: str) -> dict | None:
        """The stored result of action `key` ({"stage", "outputs"}), or None on a miss or bad entry."""
        status, data = self._read("GET", f"ac/{key}")
        if status != 200:
            return None
        try:
            entry = _ActionEntry.model_validate_json(data)
        except ValueError:
            return self._reject(f"ac/{key}", "is not a valid action entry")
        if entry.key != key:
            return self._reject(f"ac/{key}", f"names another action ({entry.key[:12]})")
        if not all(_SHA256.match(d) for d in entry.outputs.values()):
            return self._reject(f"ac/{key}", "lists a malformed output digest")
        return {"stage": entry.stage, "outputs": entry.outputs}

    def has_action(self, key: str) -> bool:
        return self._read("HEAD", f"ac/{key}")[0] == 200

    def put_action(self, key: str, result: dict) -> None:
        entry = {"key": key, "stage": result["stage"], "outputs": result["outputs"]}
        self._put(f"ac/{key}", canonical_json(entry).encode())

    # content-addressed blobs ------------------------------------------------------------------
    def get_blob(self, digest: str) -> bytes | None:
        """The blob's bytes, verified against its digest; None on a miss or wrong bytes."""
        status, data = self._read("GET", f"cas/{digest}")
        if status != 200:
            return None
        actual = hashlib.sha256(data).hexdigest()
        if actual != digest:
            return self._reject(f"cas/{digest}", f"holds {len(data):,} bytes that hash to {actual[:12]}")
        return data

    def has_blob(self, digest: str) -> bool:
        return f"cas/{digest}" not in self._bad and self._read("HEAD", f"cas/{digest}")[0] == 200

    def put_blob(self, digest: str, data: bytes) -> None:
        self._put(f"cas/{digest}", data)

    def _put(self, path: str, data: bytes) -> None:
        if not self.writable:
            return
        try:
            status, _ = self._request("PUT", path, data)
        except RemoteDown:
            return
        if status >= 300:
            # A server that refuses writes (read-only share, auth): stop writing, keep reading.
            self.problems.append(f"{self.config.url} refused PUT {path[:16]}… (HTTP {status}); not writing")
            self.config = self.config.model_copy(update={"mode": "read"})
            return
        self._bad.discard(path)

    def _reject(self, path: str, why: str) -> None:
        self._bad.add(path)
        self.problems.append(f"remote {path[:16]}… {why}: ignored, rebuilt locally")
        return None
