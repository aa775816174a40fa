"""A hostile or broken remote cache: entries naming other outputs, poisoned JSON, endless or
trickled bodies, absurd Content-Lengths, credentials in the URL. Each is a warning and a local
build, bounded in time and memory, and nothing bad is kept in the local cache."""

from __future__ import annotations

import base64
import hashlib
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from conftest import fresh_copy, make_small_ws, run_build
from npubuild.cache.remote import RemoteCache, RemoteCacheConfig
from npubuild.cache.store import Store


class _Remote(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.blobs: dict[str, bytes] = {}  # path under /cache/ -> body
        self.tamper = None  # (method, path) -> a function writing the response, or None
        self.auth: list[str | None] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/cache"


class _Handler(BaseHTTPRequestHandler):
    server: _Remote
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:
        pass

    def _path(self) -> str:
        return self.path.removeprefix("/cache/")

    def _answer(self, status: int, body: bytes = b"", send_body: bool = True) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if send_body:
            self.wfile.write(body)

    def _serve(self, send_body: bool) -> None:
        self.server.auth.append(self.headers.get("Authorization"))
        tamper = self.server.tamper and self.server.tamper(self, self._path())
        if tamper:
            return
        body = self.server.blobs.get(self._path())
        if body is None:
            self._answer(404, b"", send_body)
        else:
            self._answer(200, body, send_body)

    def do_GET(self) -> None:
        self._serve(True)

    def do_HEAD(self) -> None:
        self._serve(False)

    def do_PUT(self) -> None:
        length = int(self.headers["Content-Length"])
        self.server.blobs[self._path()] = self.rfile.read(length)
        self._answer(201)


@pytest.fixture
def remote():
    server = _Remote()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def _build(ws: Path, cache: Path, url: str, **config):
    store = Store(cache)
    client = RemoteCache(RemoteCacheConfig(url=url, **config))
    try:
        return run_build(ws, store, ("//models:cls_npu",), until="optimize", remote=client)
    finally:
        client.close()
        store.close()


@pytest.fixture
def filled(remote, tmp_path, cls_model):
    """The remote holding an honest cold build of the small workspace (up to optimize)."""
    ws = make_small_ws(tmp_path / "ws", cls_model)
    outcome = _build(ws, tmp_path / "cache-a", remote.url)
    assert outcome.ok, outcome.errors
    return ws, outcome


def _entry_path(remote: _Remote, stage: str) -> str:
    for path, body in remote.blobs.items():
        if path.startswith("ac/") and json.loads(body)["stage"] == stage:
            return path
    raise AssertionError(stage)


def test_an_entry_naming_other_outputs_is_rejected_and_never_stored(remote, filled, tmp_path):
    ws, _ = filled
    path = _entry_path(remote, "optimize")
    entry = json.loads(remote.blobs[path])
    entry["outputs"] = {"../../x": entry["outputs"]["model"]}
    entry.pop("sizes", None)
    remote.blobs[path] = json.dumps(entry).encode()
    copy = fresh_copy(ws, tmp_path / "ws2")
    outcome = _build(copy, tmp_path / "cache-b", remote.url)
    assert outcome.ok, outcome.errors
    assert outcome.executed() == {("optimize", "//models:cls_npu")}
    assert len(outcome.warnings) == 1 and "not a result of stage 'optimize'" in outcome.warnings[0]
    assert not (tmp_path / "x").exists()
    # The local cache kept the good result: a build without the remote runs nothing, no crash.
    store = Store(tmp_path / "cache-b")
    try:
        local = run_build(copy, store, ("//models:cls_npu",), until="optimize")
    finally:
        store.close()
    assert local.ok and local.executed() == set()


def test_a_poisoned_json_output_is_rejected(remote, filled, tmp_path):
    ws, _ = filled
    path = _entry_path(remote, "optimize")
    entry = json.loads(remote.blobs[path])
    garbage = b"\x00not json at all"
    digest = hashlib.sha256(garbage).hexdigest()
    remote.blobs[f"cas/{digest}"] = garbage  # hashes right: only its content is wrong
    entry["outputs"]["summary"] = digest
    entry.pop("sizes", None)
    remote.blobs[path] = json.dumps(entry).encode()
    outcome = _build(fresh_copy(ws, tmp_path / "ws2"), tmp_path / "cache-b", remote.url)
    assert outcome.ok, outcome.errors
    assert outcome.executed() == {("optimize", "//models:cls_npu")}
    assert any("output 'summary' is not JSON" in w for w in outcome.warnings)


def _lying_length(handler: _Handler, path: str) -> bool:
    if handler.command != "GET" or not path.startswith("ac/"):
        return False
    handler.send_response(200)
    handler.send_header("Content-Length", str(1 << 40))
    handler.end_headers()
    handler.wfile.write(b"{" * 1000)
    return True


def _endless_chunks(handler: _Handler, path: str) -> bool:
    if handler.command != "GET" or not path.startswith("cas/"):
        return False
    handler.send_response(200)
    handler.send_header("Transfer-Encoding", "chunked")
    handler.end_headers()
    chunk = b"x" * 65536
    try:
        for _ in range(100_000):  # 6.5 GB if nobody stops reading
            handler.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
    except OSError:
        pass
    return True


@pytest.mark.parametrize("tamper", [_lying_length, _endless_chunks])
def test_oversized_bodies_are_cut_off(remote, filled, tmp_path, tamper):
    import resource

    ws, _ = filled
    remote.tamper = tamper
    peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started = time.monotonic()
    outcome = _build(fresh_copy(ws, tmp_path / "ws2"), tmp_path / "cache-b", remote.url)
    assert outcome.ok, outcome.errors
    assert time.monotonic() - started < 120
    assert any("more than allowed" in w for w in outcome.warnings), outcome.warnings
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak_before) / 1024
    assert grown_mib < 200


def _trickle(handler: _Handler, path: str) -> bool:
    if handler.command != "GET":
        return False
    handler.send_response(200)
    handler.send_header("Content-Length", "1000")
    handler.end_headers()
    try:
        for _ in range(1000):
            handler.wfile.write(b"{")
            handler.wfile.flush()
            time.sleep(0.5)
    except OSError:
        pass
    return True


def test_a_trickling_remote_hits_the_deadline_and_the_build_goes_on(remote, filled, tmp_path):
    ws, _ = filled
    remote.tamper = _trickle
    started = time.monotonic()
    outcome = _build(fresh_copy(ws, tmp_path / "ws2"), tmp_path / "cache-b", remote.url, deadline_s=2.0)
    elapsed = time.monotonic() - started
    assert outcome.ok, outcome.errors
    assert elapsed < 60, elapsed
    assert len(outcome.warnings) == 1 and "no complete answer within 2s" in outcome.warnings[0]


def test_credentials_go_as_basic_auth_and_are_never_printed(remote, tmp_path, cls_model):
    ws = make_small_ws(tmp_path / "ws", cls_model)
    url = remote.url.replace("http://", "http://alice:s3cr%40t@")

    def refuse(handler: _Handler, path: str) -> bool:
        handler._answer(503, b"down")
        return True

    remote.tamper = refuse
    outcome = _build(ws, tmp_path / "cache", url)
    assert outcome.ok, outcome.errors
    expected = "Basic " + base64.b64encode(b"alice:s3cr@t").decode()
    assert remote.auth and all(a == expected for a in remote.auth)
    assert outcome.warnings and all("s3cr" not in w for w in outcome.warnings)
    assert any("alice:***@127.0.0.1" in w for w in outcome.warnings), outcome.warnings
