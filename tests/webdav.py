"""A real nginx serving WebDAV on loopback: the shared cache the remote-cache tests and the monorepo
benchmark talk to. `.ci/run` installs nginx from Debian's packages."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

CONF = """\
{user}
worker_processes 1;
pid {root}/nginx.pid;
error_log {root}/error.log warn;
events {{ worker_connections 256; }}
http {{
    log_format npubuild '$connection $request_method $uri $status';
    access_log {root}/access.log npubuild;
    client_body_temp_path {root}/tmp/body;
    proxy_temp_path {root}/tmp/proxy;
    fastcgi_temp_path {root}/tmp/fastcgi;
    uwsgi_temp_path {root}/tmp/uwsgi;
    scgi_temp_path {root}/tmp/scgi;
    server {{
        listen 127.0.0.1:{port};
        client_max_body_size 0;
        location /cache/ {{
            root {root}/data;
            dav_methods PUT DELETE;
            create_full_put_path on;
            dav_access user:rw group:r all:r;
        }}
    }}
}}
"""


def nginx_binary() -> str:
    found = shutil.which("nginx") or next(
        (p for p in ("/usr/sbin/nginx", "/usr/local/sbin/nginx") if os.path.exists(p)), None
    )
    if found is None:
        raise RuntimeError(
            "nginx is not installed: run .ci/run, which installs it (apt-get install nginx-light)"
        )
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class WebDavCache:
    """nginx with WebDAV at http://127.0.0.1:PORT/cache; entries live under `store`."""

    def __init__(self, root: Path, port: int | None = None):
        self.root = Path(root)
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}/cache"
        self.store = self.root / "data" / "cache"
        self._process: subprocess.Popen | None = None

    def start(self) -> WebDavCache:
        for sub in ("data/cache", "tmp"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        user = "user root;" if os.geteuid() == 0 else ""  # root's workers would otherwise be 'nobody'
        conf = self.root / "nginx.conf"
        conf.write_text(CONF.format(user=user, root=self.root, port=self.port))
        self._process = subprocess.Popen(
            [nginx_binary(), "-c", str(conf), "-p", str(self.root), "-g", "daemon off;"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(f"nginx exited: {self._process.stderr.read().decode()}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("nginx did not start listening within 10 s")

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()  # SIGTERM: nginx's fast shutdown, connections dropped
            self._process.wait(10)
        self._process = None

    def requests(self) -> list[tuple[str, str, str, int]]:
        """(connection serial, method, uri, status) of every request nginx logged."""
        log = self.root / "access.log"
        rows = [line.split() for line in log.read_text().splitlines()] if log.exists() else []
        return [(c, m, u, int(s)) for c, m, u, s in rows]

    def entries(self, kind: str) -> list[Path]:
        directory = self.store / kind
        return sorted(directory.iterdir()) if directory.is_dir() else []

    def __enter__(self) -> WebDavCache:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
