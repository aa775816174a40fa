"""Stage code versions computed from the code itself: a stage's version covers every npubuild module
its module can import (the static import closure, read from the source, never a hand-kept list)
and the versions of the libraries whose numerics its results depend on.

Reading and hashing the sources costs tens of milliseconds, too much for every no-op build, so the
versions are computed once per installed tree: `tree_stamp()` (the stat of every module and of the
libraries' entry files) keys a record in the cache's metadata, and an unchanged tree reuses it.
"""

from __future__ import annotations

import hashlib
import os
from functools import cache, lru_cache
from importlib.util import find_spec
from pathlib import Path

import npubuild

PACKAGE_DIR = Path(npubuild.__file__).parent
# Libraries whose versions change what a stage computes (numerics, protobuf encoding, decoding).
LIBRARIES = ("numpy", "onnx", "onnxruntime", "PIL")
_DISTRIBUTIONS = {"PIL": "Pillow"}


def module_files(package_dir: Path = PACKAGE_DIR) -> dict[str, Path]:
    """Every module of the package: dotted name -> file (a package's name maps to its __init__)."""
    found: dict[str, Path] = {}
    top = package_dir.name
    for dirpath, dirnames, filenames in os.walk(package_dir):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__" and not d.startswith("."))
        rel = Path(dirpath).relative_to(package_dir).parts
        for f in sorted(filenames):
            if not f.endswith(".py"):
                continue
            parts = [top, *rel] + ([] if f == "__init__.py" else [f[:-3]])
            found[".".join(parts)] = Path(dirpath) / f
    return found


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules that `name` names in any import statement (function-level and
    TYPE_CHECKING ones included: a superset is safe, a subset would serve stale results)."""
    named = _named_imports(name, path.name == "__init__.py", path.read_bytes())
    return {m for m in named if m in modules and m != name}


@lru_cache(maxsize=1024)
def _named_imports(name: str, is_package: bool, source: bytes) -> frozenset[str]:
    import ast  # only when the tree changed: a no-op build never parses

    package = name if is_package else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                origin = ".".join(base + ([node.module] if node.module else []))
            else:
                origin = node.module or ""
            targets = [origin] + [f"{origin}.{alias.name}" for alias in node.names]
        else:
            continue
        for target in targets:
            parts = target.split(".")
            # Importing a.b.c runs a/__init__, a/b/__init__ and a/b/c.
            found.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
    return frozenset(found)


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def import_closure(graph: dict[str, set[str]], root: str) -> set[str]:
    """Every module importing `root` may load (itself and its parent packages included)."""
    parts = root.split(".")
    todo = [".".join(parts[:i]) for i in range(1, len(parts) + 1)]
    seen: set[str] = set()
    while todo:
        name = todo.pop()
        if name in seen or name not in graph:
            continue
        seen.add(name)
        todo.extend(graph[name])
    return seen


def library_versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for lib in LIBRARIES:
        dist = _DISTRIBUTIONS.get(lib, lib)
        try:
            found[dist] = version(dist)
        except PackageNotFoundError:
            found[dist] = "absent"
    return found


def compute_versions(stages: dict, package_dir: Path = PACKAGE_DIR) -> dict[str, str]:
    """stage name -> '<registry version>-<digest of its closure's sources and the libraries>'."""
    modules = module_files(package_dir)
    graph = import_graph(modules)
    libraries = sorted(library_versions().items())
    versions = {}
    for name, info in stages.items():
        h = hashlib.sha256(f"{info.version}\0{libraries}".encode())
        for module in sorted(import_closure(graph, info.module)):
            h.update(module.encode() + b"\0" + modules[module].read_bytes() + b"\0")
        versions[name] = f"{info.version}-{h.hexdigest()[:16]}"
    return versions


def tree_stamp(package_dir: Path = PACKAGE_DIR) -> str:
    """Changes whenever a module of the package or a library's entry file changes on disk
    (size, mtime, ctime or inode: an edit that restores the mtime still moves the ctime)."""
    h = hashlib.sha256(npubuild.__version__.encode())
    for name, path in module_files(package_dir).items():
        st = os.stat(path)
        h.update(f"{name}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}:{st.st_ino}\n".encode())
    for lib in LIBRARIES:
        spec = find_spec(lib)  # finds the file without importing the library
        origin = spec.origin if spec is not None else None
        if origin and os.path.exists(origin):
            st = os.stat(origin)
            h.update(f"{lib}:{origin}:{st.st_size}:{st.st_mtime_ns}:{st.st_ino}\n".encode())
        else:
            h.update(f"{lib}:absent\n".encode())
    return h.hexdigest()


@cache
def current_stamp() -> str:
    return tree_stamp()


_known: dict[str, dict[str, str]] = {}


def versions(store=None) -> dict[str, str]:
    """The code version of every stage for the installed tree; from the store's record when it has
    one for this tree, else computed (and recorded there)."""
    stamp = current_stamp()
    if stamp in _known:
        return _known[stamp]
    record = store.get_meta(f"code/{stamp}") if store is not None else None
    from npubuild.stages import STAGES

    if not (isinstance(record, dict) and set(record) == set(STAGES)):
        record = compute_versions(STAGES)
        if store is not None:
            store.set_meta(f"code/{stamp}", record)
    _known[stamp] = record
    return record
