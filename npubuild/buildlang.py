"""BUILD files are Starlark (starlark-rust through starlark-pyo3): `def` macros, comprehensions,
`load("//tools:defs.bzl", "name")` across packages, and the rules, `glob` and `pypi_file`.

A BUILD file is untrusted input, so it is evaluated in a child process (forked; `python -m
npubuild.buildlang` where fork is unavailable) with an address-space limit (`MAX_MEMORY` beyond
the parent's) and a wall-time budget (`MAX_SECONDS`: Starlark checks a cancellation flag every
~1000 instructions; the child is killed half a second later): an endless loop or a
billion-element list is one error, never a hung or swapping machine. Starlark itself has no I/O
and no imports; `load` reads only `.bzl` files inside the workspace. The child only records the
calls the file makes (rule, glob, pypi_file, with the file:line:col of each and of its keyword
arguments); this process replays them through the rule functions, which validate the attributes.
A BUILD file is evaluated only when it changed (the analysis cache, engine/analysis.py).

Locations: the child evaluates the file one top-level statement at a time, so every call knows
the statement it came from; a rule written in the BUILD file itself points at its own keyword
arguments, a rule a macro makes points at the macro's call.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from npubuild.errors import Location, UserError

MAX_SECONDS = 4.0  # Starlark's own check; the child is killed half a second after it
MAX_MEMORY = 1 << 30  # bytes of address space for the child evaluating one BUILD file
MAX_OUTPUT = 64 << 20  # bytes of recorded calls the child may hand back
MAX_SOURCE_BYTES = 1 << 20
MAX_LOAD_DEPTH = 32
BZL_SUFFIX = ".bzl"


@dataclass(frozen=True)
class Arg:
    """A keyword argument's value with where it was written, so validation errors can point at it."""

    value: Any
    location: Location


# A builtin receives (positional values, keyword Args, location of the call) and returns a value.
Builtin = Callable[[list[Any], dict[str, Arg], Location], Any]


# --- this process: run the child, replay its calls ----------------------------------------------


def evaluate(
    source: str, path: str, builtins: dict[str, Builtin], root: Path, package_dir: Path
) -> list[str]:
    """Evaluate one BUILD file (`path` relative to the workspace `root`) and replay its calls
    through `builtins`; returns the workspace-relative .bzl files it loaded."""
    if len(source.encode()) > MAX_SOURCE_BYTES:
        raise UserError(f"BUILD file larger than {MAX_SOURCE_BYTES} bytes", Location(path))
    request = {
        "source": source,
        "path": path,
        "root": str(root),
        "package_dir": str(package_dir),
        "names": sorted(builtins),
    }
    reply = _run_child(request, path)
    if reply.get("error"):
        e = reply["error"]
        raise UserError(e["message"], Location(e["path"], e.get("line") or 0, e.get("col") or 0))
    results: list[Any] = []
    for event in reply["events"]:
        loc = Location(path, *event["loc"])
        kwlocs = event.get("kwlocs", {})
        kwargs = {
            k: Arg(_restore(v, results), Location(path, *kwlocs[k]) if k in kwlocs else loc)
            for k, v in event["kwargs"].items()
        }
        args = [_restore(v, results) for v in event["args"]]
        results.append(builtins[event["call"]](args, kwargs, loc))
    return reply["loaded"]


def _restore(value: Any, results: list[Any]) -> Any:
    """A recorded value with each call's result put back where the file used it (pypi_file)."""
    if isinstance(value, dict):
        if set(value) == {"__npubuild_call__"}:
            return results[value["__npubuild_call__"]]
        return {k: _restore(v, results) for k, v in value.items()}
    if isinstance(value, list):
        return [_restore(v, results) for v in value]
    return value


def _limits(extra_address_space: int = 0) -> None:
    """In the child, before it evaluates: bounded memory and CPU, no core file."""
    import resource

    def lower(kind: int, wanted: int) -> None:  # never above a limit already set
        _, hard = resource.getrlimit(kind)
        value = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        resource.setrlimit(kind, (value, value))

    lower(resource.RLIMIT_AS, MAX_MEMORY + extra_address_space)
    lower(resource.RLIMIT_CPU, int(MAX_SECONDS) + 2)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _address_space() -> int:
    """This process's address space now (a forked child starts with all of it)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 4 << 30  # not Linux: a generous allowance instead


def _forked(request: dict) -> tuple[bytes, str, str | None]:
    """(reply, progress, why it stopped) from a forked child: no interpreter to start, so a BUILD
    file costs milliseconds; the child inherits this process and gets MAX_MEMORY beyond it."""
    import select
    import signal
    import time

    extra = _address_space()
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: evaluate, write "at N" lines and then "=" + the reply, exit
        os.close(read_end)
        code = 0
        try:
            import faulthandler

            faulthandler.disable()  # a crash here is reported by the parent, in one line
            quiet = os.open(os.devnull, os.O_WRONLY)  # a Rust panic's backtrace is not the user's
            os.dup2(quiet, 1)
            os.dup2(quiet, 2)
            _limits(extra)
            reply = _evaluate_in_child(request, lambda line: os.write(write_end, f"at {line}\n".encode()))
            data = b"=" + json.dumps(reply).encode() + b"\n"
            view = memoryview(data)
            while view:  # a pipe takes what it can per write
                view = view[os.write(write_end, view) :]
        except MemoryError:
            code = 75
        except BaseException:
            code = 70
        os._exit(code)
    os.close(write_end)
    chunks, deadline, stopped = [], time.monotonic() + MAX_SECONDS + 0.5, None
    size = 0
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([read_end], [], [], left)[0]:
                os.kill(pid, signal.SIGKILL)
                stopped = "time"
                break
            chunk = os.read(read_end, 1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
            if size > MAX_OUTPUT + (1 << 20):
                os.kill(pid, signal.SIGKILL)
                stopped = "output"
                break
    finally:
        os.close(read_end)
        _, status = os.waitpid(pid, 0)
    text = b"".join(chunks)
    reply_at = text.find(b"\n=")
    reply = text[reply_at + 2 :] if reply_at >= 0 else (text[1:] if text.startswith(b"=") else b"")
    progress = text[: reply_at + 1 if reply_at >= 0 else len(text)].decode(errors="replace")
    if stopped is None and os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGSEGV:
        stopped = "crash"  # the evaluator's own stack: deeply nested source
    elif stopped is None and (not os.WIFEXITED(status) or os.WEXITSTATUS(status) != 0 or not reply):
        stopped = "memory"
    return reply, progress, stopped


def _spawned(request: dict) -> tuple[bytes, str, str | None]:
    """The same through a new interpreter, where fork is not available."""
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "npubuild.buildlang"],
            input=json.dumps(request).encode(),
            capture_output=True,
            timeout=MAX_SECONDS + 0.5,  # one operation (a huge integer product) can outlast the check
            preexec_fn=_limits if os.name == "posix" else None,
        )
    except subprocess.TimeoutExpired as exc:
        return b"", (exc.stderr or b"").decode(errors="replace"), "time"
    stopped = None if proc.returncode == 0 else "memory"
    return proc.stdout, proc.stderr.decode(errors="replace"), stopped


def _run_child(request: dict, path: str) -> dict:
    """The child's reply; a child that ran out of time or memory is one error at the line of the
    top-level statement it was evaluating (it reports each one as it starts it)."""
    reply, progress, stopped = (_forked if hasattr(os, "fork") else _spawned)(request)
    if stopped is None and len(reply) > MAX_OUTPUT:
        stopped = "output"
    if stopped is None:
        return json.loads(reply)
    starts = [int(ln[3:]) for ln in progress.splitlines() if ln.startswith("at ") and ln[3:].isdigit()]
    where = Location(path, starts[-1]) if starts else Location(path)
    if stopped == "time":
        raise UserError(f"evaluation took longer than {MAX_SECONDS:g} s (an endless or long loop?)", where)
    if stopped == "crash":
        raise UserError("evaluation ran out of stack (an expression nested too deeply?)", where)
    if stopped == "output":
        raise UserError(f"the file's targets take more than {MAX_OUTPUT >> 20} MiB", where)
    raise UserError(
        f"evaluation needed more than {MAX_MEMORY >> 20} MiB of memory (or too large a value); stopped",
        where,
    )


# --- the child: evaluate with starlark-rust, record the calls -----------------------------------


class _Stop(Exception):
    """An error the child reports as one line at a location."""

    def __init__(self, message: str, path: str, line: int | None = None, col: int | None = None):
        super().__init__(message)
        self.where = (path, line, col)


def _statements(source: str) -> list[tuple[int, int, dict[str, list[dict]]]]:
    """(first line, last line, the calls it spells by name) of each top-level statement, from
    Python's parser (Starlark's syntax is Python's); empty when Python cannot parse it."""
    import ast

    try:
        module = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return []
    spans: list[tuple[int, int, dict[str, list[dict]]]] = []
    for stmt in module.body:
        calls: dict[str, list[dict]] = {}
        nodes = sorted(
            (n for n in ast.walk(stmt) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)),
            key=lambda n: (n.lineno, n.col_offset),
        )
        for node in nodes:
            calls.setdefault(node.func.id, []).append(
                {
                    "loc": [node.lineno, node.col_offset + 1],
                    "kwlocs": {
                        k.arg: [k.value.lineno, k.value.col_offset + 1] for k in node.keywords if k.arg
                    },
                }
            )
        first, last = stmt.lineno, stmt.end_lineno or stmt.lineno
        if spans and first <= spans[-1][1]:  # two statements on one line (a; b): one chunk
            merged = spans[-1][2]
            for name, found in calls.items():
                merged.setdefault(name, []).extend(found)
            spans[-1] = (spans[-1][0], max(last, spans[-1][1]), merged)
        else:
            spans.append((first, last, calls))
    return spans


def _error(exc: Exception, fallback: str) -> _Stop:
    """One line from a Starlark error: its message and the first file:line:col it points at."""
    import re

    text = str(exc)
    message = next((ln[len("error: ") :] for ln in text.splitlines() if ln.startswith("error: ")), text)
    message = re.sub(r"^(StarlarkError|UserError|ValueError|TypeError|_Stop): ", "", message.strip())
    if "Evaluation cancelled" in message:
        message = f"evaluation took longer than {MAX_SECONDS:g} s (an endless or long loop?)"
    unknown = re.match(r"Variable `(\w+)` not found(.*)", message)
    if unknown:  # a call of a name nothing defines is most often a misspelt rule
        name, hint = unknown.groups()
        kind = "rule or function" if re.search(rf"\b{name}\s*\(", text) else "name"
        message = f"unknown {kind} '{name}'{hint.replace('`', chr(39))}"
    if message.startswith("Parse error: "):
        detail = message[len("Parse error: ") :]
        message = "syntax error: " + (detail if len(detail) <= 120 else detail[:117] + "...")
    where = re.search(r"--> (\S+?):(\d+):(\d+)", text)
    if where:
        return _Stop(message, where.group(1), int(where.group(2)), int(where.group(3)))
    return _Stop(message, fallback)


class _Recorder:
    """The child's builtins: rules and pypi_file record their call; glob lists files (in the
    package, as the file's own glob would) and records its call too."""

    def __init__(self, request: dict):
        self.path = request["path"]
        self.package_dir = Path(request["package_dir"])
        self.events: list[dict] = []
        self.site: tuple[list[int], dict[str, list[dict]]] = ([1, 1], {})
        self.used: dict[str, int] = {}

    def at(self, first_line: int, calls: dict[str, list[dict]]) -> None:
        self.site = ([first_line, 1], calls)
        self.used = {}

    def _where(self, name: str) -> tuple[list[int], dict[str, list[int]]]:
        statement, calls = self.site
        spelled = calls.get(name, [])
        if not spelled:  # made by a macro: the macro's call in this file
            return statement, {}
        k = min(self.used.get(name, 0), len(spelled) - 1)
        self.used[name] = k + 1
        return spelled[k]["loc"], spelled[k]["kwlocs"]

    def callable(self, name: str):
        def call(*args, **kwargs):
            loc, kwlocs = self._where(name)
            if name == "glob":
                return self._glob(args, kwargs, loc)
            self.events.append(
                {"call": name, "args": list(args), "kwargs": kwargs, "loc": loc, "kwlocs": kwlocs}
            )
            return {"__npubuild_call__": len(self.events) - 1} if name == "pypi_file" else None

        return call

    def _glob(self, args, kwargs, loc):
        from npubuild.layout import glob_files

        include = args[0] if args else kwargs.get("include")
        exclude = kwargs.get("exclude", args[1] if len(args) > 1 else [])
        lists = isinstance(include, list) and isinstance(exclude, list)
        if set(kwargs) - {"include", "exclude"} or not lists:
            raise _Stop("glob(include, exclude=[]) takes two lists of patterns", self.path, *loc)
        try:
            found = glob_files(self.package_dir, include, exclude)
        except UserError as exc:
            raise _Stop(exc.message, self.path, *loc) from None
        self.events.append({"call": "glob", "args": [include, exclude], "kwargs": {}, "loc": loc})
        return found


def _evaluate_in_child(request: dict, progress: Callable[[int], Any]) -> dict:
    import time

    import starlark as sl

    root = Path(request["root"])
    path, source = request["path"], request["source"]
    recorder = _Recorder(request)
    dialect = sl.Dialect.extended()
    base = sl.Globals.standard()
    started = time.monotonic()
    options = sl.EvalOptions(check_cancelled=lambda: time.monotonic() - started > MAX_SECONDS)
    loaded: list[str] = []
    loading: list[str] = []
    modules: dict[str, Any] = {}

    def new_module():
        module = sl.Module()
        for name in request["names"]:
            module.add_callable(name, recorder.callable(name))
        return module

    def load(label: str):
        rel = _bzl_path(label, path)
        if rel in modules:
            return modules[rel]
        if rel in loading or len(loading) >= MAX_LOAD_DEPTH:
            raise _Stop(f"load cycle or depth: {' -> '.join([*loading, rel])}", path)
        file = (root / rel).resolve()
        if not file.is_relative_to(root.resolve()) or not file.is_file():
            raise _Stop(f"load('{label}'): no file {rel} in the workspace", path)
        text = file.read_text(encoding="utf-8")
        if len(text.encode()) > MAX_SOURCE_BYTES:
            raise _Stop(f"{rel}: larger than {MAX_SOURCE_BYTES} bytes", rel)
        loading.append(rel)
        module = new_module()
        sl.eval_with(options, module, sl.parse(rel, text, dialect), base, sl.FileLoader(load))
        loading.pop()
        loaded.append(rel)
        modules[rel] = module.freeze()
        return modules[rel]

    module = new_module()
    try:
        sl.parse(path, source, dialect)  # syntax errors first, with Starlark's own message
        spans = _statements(source) or [(1, source.count("\n") + 1, {})]
        lines = source.splitlines(keepends=True)
        for first, last, calls in spans:
            recorder.at(first, calls)
            progress(first)  # where the parent says a killed evaluation stopped
            chunk = "\n" * (first - 1) + "".join(lines[first - 1 : last])
            sl.eval_with(options, module, sl.parse(path, chunk, dialect), base, sl.FileLoader(load))
    except _Stop as stop:
        return {"error": dict(zip(("path", "line", "col"), stop.where), message=str(stop))}
    except sl.StarlarkError as exc:
        stop = exc.__cause__ if isinstance(exc.__cause__, _Stop) else _error(exc, path)
        return {"error": dict(zip(("path", "line", "col"), stop.where), message=str(stop))}
    except (OSError, UnicodeDecodeError) as exc:
        return {"error": {"path": path, "message": f"cannot read a loaded file ({exc})"}}
    return {"events": recorder.events, "loaded": sorted(set(loaded))}


def _bzl_path(label: str, current: str) -> str:
    """The workspace-relative file a load() label names: //pkg:file.bzl, or :file.bzl in the
    loading file's package."""
    if not isinstance(label, str) or not label.endswith(BZL_SUFFIX):
        raise _Stop(f"load('{label}'): only .bzl files can be loaded", current)
    if label.startswith("//"):
        package, _, name = label[2:].partition(":")
    elif label.startswith(":"):
        package, name = os.path.dirname(current), label[1:]
    else:
        raise _Stop(f"load('{label}'): expected '//package:file.bzl' or ':file.bzl'", current)
    parts = [p for p in [*package.split("/"), *name.split("/")] if p]
    if not name or any(p in (".", "..") for p in parts):
        raise _Stop(f"load('{label}'): the file must stay inside the workspace", current)
    return "/".join(parts)


def _child_main() -> None:
    request = json.loads(sys.stdin.buffer.read())

    def progress(line: int) -> None:
        sys.stderr.write(f"at {line}\n")
        sys.stderr.flush()

    sys.stdout.write(json.dumps(_evaluate_in_child(request, progress)))


if __name__ == "__main__":
    _child_main()
