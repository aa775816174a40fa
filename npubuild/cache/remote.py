"""A client for a shared cache that speaks the Bazel HTTP cache protocol.

GET/PUT/HEAD `<base>/ac/<sha256>` (action results, our JSON) and `<base>/cas/<sha256>` (blobs);
404 is a miss. bazel-remote (with `--disable_http_ac_validation`, since our action entries are JSON,
not Bazel's ActionResult protobuf) and nginx with WebDAV serve it.

Nothing read from the remote is trusted: a blob must hash to its name, an action entry must name its
own key and list well-formed output digests (the engine then checks them against the stage's
declared outputs). A bad entry is reported and treated as a miss, so the action is rebuilt locally
(and, in read-write mode, the good bytes are written over the bad ones). Every answer is bounded:
bodies by a size (the size an entry declares for a blob, else a global maximum; action entries by
a small one), every request by an overall deadline, whatever the server trickles. Credentials in
the URL are sent as Basic auth and never printed. One connection is kept open and reused; a failed
request is retried, and when the cache cannot be reached at all the client marks itself down and
every later call is a quiet miss: the build goes on with the local cache only.
"""

from __future__ import annotations

import base64
import hashlib
import http.client
import socket
import threading
import time
from typing import BinaryIO, Literal
from urllib.parse import unquote, urlsplit

from pydantic import BaseModel, Field, field_validator

from npubuild.cache.digest import SHA256_HEX, canonical_json
from npubuild.errors import UserError

_CHUNK = 1 << 20
MAX_ENTRY_BYTES = 1 << 20  # an action entry is a few hundred bytes of JSON
_MAX_ERROR_BODY = 64 << 10  # what is read (and dropped) of a 404 or an error page


def redact(url: str) -> str:
    """The URL with any password replaced, for every message a user or a log sees."""
    parts = urlsplit(url)
    if parts.password is None and "@" not in parts.netloc:
        return url
    host = parts.netloc.rpartition("@")[2]
    user = parts.username or ""
    return parts._replace(netloc=f"{user}:***@{host}" if user else f"***@{host}").geturl()


class RemoteCacheConfig(BaseModel):
    """What a worker needs to reach the shared cache; plain JSON so it travels with an action."""

    url: str
    mode: Literal["readwrite", "read"] = "readwrite"
    timeout_s: float = Field(10.0, gt=0)  # one read or connect
    retries: int = Field(2, ge=0)
    deadline_s: float = Field(600.0, gt=0)  # one whole request, body included
    max_blob_bytes: int = Field(16 << 30, gt=0)  # a blob whose entry declares no size

    @field_validator("url")
    @classmethod
    def _http_url(cls, url: str) -> str:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"remote cache must be an http:// or https:// URL, not '{redact(url)}'")
        return url.rstrip("/")

    @property
    def display_url(self) -> str:
        return redact(self.url)


def config_from_cli(url: str, mode: str) -> RemoteCacheConfig:
    from pydantic import ValidationError

    try:
        return RemoteCacheConfig(url=url, mode=mode)
    except ValidationError as exc:
        raise UserError(f"--remote-cache: {exc.errors()[0]['msg']}") from None


class RemoteDown(Exception):
    """The remote cache could not be reached after the retries."""


class _HashingSink:
    """Where a blob's body goes: a file, hashed on the way."""

    def __init__(self, file: BinaryIO):
        self.file = file
        self.reset()

    def reset(self) -> None:
        self.file.seek(0)
        self.file.truncate()
        self._h = hashlib.sha256()
        self.size = 0

    def write(self, chunk: bytes) -> None:
        self._h.update(chunk)
        self.size += len(chunk)
        self.file.write(chunk)

    def hexdigest(self) -> str:
        return self._h.hexdigest()


class _TooLarge(Exception):
    """A body longer than the request allows."""


class _ActionEntry(BaseModel):
    key: str
    stage: str
    outputs: dict[str, str]
    sizes: dict[str, int] | None = None  # bytes of each output, so a download can be capped


class RemoteCache:
    def __init__(self, config: RemoteCacheConfig):
        self.config = config
        parts = urlsplit(config.url)
        self._https = parts.scheme == "https"
        self._host = parts.hostname or ""
        self._port = parts.port
        self._base = parts.path.rstrip("/")
        self._auth = None
        if parts.username is not None:
            secret = f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()
            self._auth = "Basic " + base64.b64encode(secret).decode()
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

    def _request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        limit: int = MAX_ENTRY_BYTES,
        sink: _HashingSink | None = None,
    ) -> tuple[int, bytes]:
        """(status, body); a 200 body goes to `sink` when one is given. Retries connection errors
        and 5xx; raises RemoteDown when all failed or the deadline passed, _TooLarge for a body
        over `limit` bytes."""
        if self.down is not None:
            raise RemoteDown(self.down)
        headers = {"Content-Length": str(len(body))} if body is not None else {}
        if self._auth:
            headers["Authorization"] = self._auth
        last = ""
        for attempt in range(self.config.retries + 1):
            if attempt:
                time.sleep(0.1 * 2 ** (attempt - 1))
            if sink is not None:
                sink.reset()  # a retry starts the body afresh
            expired = threading.Event()
            timer = threading.Timer(self.config.deadline_s, self._expire, (expired,))
            timer.daemon = True
            timer.start()
            try:
                conn = self._connection()
                conn.request(method, f"{self._base}/{path}", body=body, headers=headers)
                response = conn.getresponse()
                ok = response.status == 200
                data = self._read_body(response, limit if ok else _MAX_ERROR_BODY, sink if ok else None)
                if expired.is_set():
                    raise TimeoutError("deadline")
                self.requests += 1
                if response.will_close:
                    self.close()
                if response.status >= 500:
                    last = f"HTTP {response.status} {response.reason}"
                    continue
                return response.status, data
            except _TooLarge:
                self.close()
                raise
            except (OSError, http.client.HTTPException, ValueError) as exc:
                # A kept-alive connection the server closed fails once; a fresh one then works.
                self.close()
                if expired.is_set():
                    last = f"no complete answer within {self.config.deadline_s:g}s"
                    break
                last = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            finally:
                timer.cancel()
        self.down = f"{self.config.display_url} unreachable ({last})"
        raise RemoteDown(self.down)

    @staticmethod
    def _read_body(response: http.client.HTTPResponse, limit: int, sink: _HashingSink | None) -> bytes:
        declared = response.length  # None when not declared; 0 for HEAD, whatever the header says
        if declared is not None and declared > limit:
            raise _TooLarge(f"declares {declared:,} bytes")
        parts, received = [], 0
        while chunk := response.read1(_CHUNK):  # returns what has arrived: the deadline can act
            received += len(chunk)
            if received > limit:
                raise _TooLarge(f"sent more than {limit:,} bytes")
            if sink is not None:
                sink.write(chunk)
            else:
                parts.append(chunk)
        if response.length:  # http.client counts down the declared length; the peer stopped short
            raise http.client.IncompleteRead(b"", response.length)
        response.read()  # nothing left: marks the response done so the connection can be reused
        return b"".join(parts)

    def _expire(self, expired: threading.Event) -> None:
        """The deadline passed: cut the connection so that a blocked read returns."""
        expired.set()
        conn = self._conn
        sock = getattr(conn, "sock", None) if conn is not None else None
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _read(self, method: str, path: str, limit: int = MAX_ENTRY_BYTES, sink=None) -> tuple[int, bytes]:
        """A GET or HEAD; a cache that is down answers as a miss (status 0), a body over the limit
        as a rejected entry (status -1)."""
        try:
            return self._request(method, path, limit=limit, sink=sink)
        except RemoteDown:
            return 0, b""
        except _TooLarge as exc:
            self._reject(path, f"{exc} (more than allowed)")
            return -1, b""

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
        if not all(SHA256_HEX.match(d) for d in entry.outputs.values()):
            return self._reject(f"ac/{key}", "lists a malformed output digest")
        if entry.sizes is not None and set(entry.sizes) != set(entry.outputs):
            return self._reject(f"ac/{key}", "declares sizes of other outputs")
        found: dict = {"stage": entry.stage, "outputs": entry.outputs}
        if entry.sizes is not None:
            found["sizes"] = entry.sizes
        return found

    def has_action(self, key: str) -> bool:
        return self._read("HEAD", f"ac/{key}")[0] == 200

    def put_action(self, key: str, result: dict, sizes: dict[str, int] | None = None) -> None:
        entry = {"key": key, "stage": result["stage"], "outputs": result["outputs"]}
        if sizes is not None:
            entry["sizes"] = sizes
        self._put(f"ac/{key}", canonical_json(entry).encode())

    def reject_action(self, key: str, why: str) -> None:
        """The engine found the entry is not what its action writes."""
        self._reject(f"ac/{key}", why)

    # content-addressed blobs ------------------------------------------------------------------
    def get_blob(self, digest: str, sink: BinaryIO, size: int | None = None) -> bool:
        """Write the blob into `sink` (at most `size` bytes, or the configured maximum) and verify
        it against its digest; False on a miss, wrong bytes or too many of them."""
        limit = min(size, self.config.max_blob_bytes) if size is not None else self.config.max_blob_bytes
        hashing = _HashingSink(sink)
        status, _ = self._read("GET", f"cas/{digest}", limit=limit, sink=hashing)
        if status != 200:
            return False
        if hashing.hexdigest() != digest:
            actual = hashing.hexdigest()[:12]
            self._reject(f"cas/{digest}", f"holds {hashing.size:,} bytes that hash to {actual}")
            return False
        return True

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
            self.problems.append(
                f"{self.config.display_url} refused PUT {path[:16]}… (HTTP {status}); not writing"
            )
            self.config = self.config.model_copy(update={"mode": "read"})
            return
        self._bad.discard(path)

    def _reject(self, path: str, why: str) -> None:
        self._bad.add(path)
        self.problems.append(f"remote {path[:16]}… {why}: ignored, rebuilt locally")
        return None
