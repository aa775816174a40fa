"""The `npubuild` command line. Heavy modules (onnx, onnxruntime, numpy) are never imported here:
stages load them inside the workers, so a build with nothing to do stays fast."""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from npubuild.cli_common import _root, _store, _workspace, app, cache_app, err, options, out
from npubuild.errors import UserError


class _LiveProgress:
    """A spinner naming the running actions, and one line per action that ran or failed."""

    def __init__(self) -> None:
        self.running: dict[str, float] = {}
        self.done = 0
        self.status = None

    def _text(self) -> str:
        names = ", ".join(self.running)
        return f"[bold]building[/] {names}  [dim]({self.done} done)[/]"

    def started(self, action) -> None:
        if not err.is_terminal:  # a log or a pipe: no spinner, so say what started and when
            err.print(f"  started {action.stage} {escape(action.owner)}", highlight=False)
            return
        if self.status is None:
            self.status = err.status(self._text())
            self.status.start()
        self.running[f"{action.stage} {action.owner}"] = time.perf_counter()
        self.status.update(self._text())

    def finished(self, action, result) -> None:
        name = f"{action.stage} {action.owner}"
        self.running.pop(name, None)
        self.done += 1
        mark = {"ran": "[green]ran[/]", "failed": "[red]FAILED[/]"}.get(result.status, result.status)
        err.print(f"  {mark} {escape(name)} [dim]{result.seconds:.1f}s[/]", highlight=False)
        if self.status is not None:
            self.status.update(self._text())

    def stop(self) -> None:
        if self.status is not None:
            self.status.stop()


@app.command()
def build(
    patterns: Annotated[list[str], typer.Argument(help="Targets or patterns: //pkg:name, //pkg:all, //...")],
    jobs: Annotated[
        int | None,
        typer.Option("--jobs", "-j", min=1, help="Actions run in parallel (default: CPUs, or Ray's)."),
    ] = None,
    keep_going: Annotated[
        bool, typer.Option("--keep-going", "-k", help="Build what does not depend on a failure.")
    ] = False,
    until: Annotated[str | None, typer.Option(help="Stop each npu_model after this stage.")] = None,
    remote_cache: Annotated[
        str | None,
        typer.Option(
            envvar="NPUBUILD_REMOTE_CACHE",
            help="Shared cache speaking the Bazel HTTP protocol, e.g. http://host:8080/cache.",
        ),
    ] = None,
    remote_cache_mode: Annotated[
        str, typer.Option(help="readwrite, or read to use the shared cache without writing to it.")
    ] = "readwrite",
    executor: Annotated[str, typer.Option(help="local (a process pool) or ray.")] = "local",
    ray_address: Annotated[
        str | None, typer.Option(help="Ray cluster to run on (default: Ray's own lookup, else a local one).")
    ] = None,
) -> None:
    """Build targets: run what changed, reuse the rest from the cache."""
    from npubuild.engine.run import build as run_build

    root, store = _root(), _store()
    remote, runner = _remote_and_executor(remote_cache, remote_cache_mode, executor, ray_address, jobs)
    progress = _LiveProgress()
    try:
        outcome = run_build(
            root,
            store,
            patterns,
            jobs=jobs or os.cpu_count() or 1,
            keep_going=keep_going,
            until=until,
            progress=progress,
            remote=remote,
            executor=runner,
        )
    finally:
        progress.stop()
        if remote is not None:
            remote.close()
        if runner is not None:
            runner.close()
    code = _finish_build(store, outcome)
    if code:
        raise typer.Exit(code)


def _remote_and_executor(url: str | None, mode: str, executor: str, ray_address: str | None, jobs):
    """The remote cache client (None without --remote-cache) and a Ray executor (None for local)."""
    remote = None
    if mode not in ("readwrite", "read"):
        raise UserError(f"--remote-cache-mode must be readwrite or read, not '{mode}'")
    if url:
        from npubuild.cache.remote import RemoteCache, config_from_cli

        remote = RemoteCache(config_from_cli(url, mode))
    if executor == "local":
        if ray_address:
            raise UserError("--ray-address needs --executor ray")
        return remote, None
    if executor != "ray":
        raise UserError(f"--executor must be local or ray, not '{executor}'")
    if remote is None:
        raise UserError("--executor ray needs --remote-cache: Ray workers exchange inputs and results there")
    from npubuild.engine.executors import RayExecutor

    return remote, RayExecutor(ray_address, jobs)


@app.command()
def test(
    patterns: Annotated[list[str], typer.Argument(help="Targets or patterns: //pkg:name, //pkg:all, //...")],
    junit: Annotated[
        Path | None, typer.Option(help="JUnit XML report (default npubuild-out/testlogs/junit.xml).")
    ] = None,
    jobs: Annotated[
        int | None, typer.Option("--jobs", "-j", min=1, help="Actions run in parallel (default: CPUs).")
    ] = None,
) -> None:
    """Build, then check every npu_model's gates. Exit 0: all passed; 3: a gate failed; 1: build error."""
    from npubuild.engine.run import build as run_build
    from npubuild.gates import check
    from npubuild.gates import junit as junit_xml
    from npubuild.labels import parse_label
    from npubuild.layout import OUT_DIR
    from npubuild.report import plural, summary_of

    root, store = _root(), _store()
    progress = _LiveProgress()
    try:
        outcome = run_build(
            root, store, patterns, jobs=jobs or os.cpu_count() or 1, keep_going=True, progress=progress
        )
    finally:
        progress.stop()
    build_code = _finish_build(store, outcome)
    ws = _workspace()
    results, build_errors = {}, {}
    for plan in outcome.plans:
        if plan.kind != "npu_model":
            continue
        label = str(plan.label)
        failed = [step for step, a in plan.steps if outcome.result(a).status not in ("ran", "cached")]
        if failed:
            build_errors[label] = f"not built: {', '.join(failed)}"
            continue
        summaries = {step: summary_of(store, outcome, a) for step, a in plan.steps}
        gates = ws.target(parse_label(label)).attrs.gates.declared()
        results[label] = check(label, gates, {k: v for k, v in summaries.items() if v})
    for label, rows in results.items():
        for r in rows:
            mark = "[green]PASS[/]" if r.ok else "[red]FAIL[/]"
            out.print(f"{mark} {escape(label)} {escape(r.describe())}")
        if not rows:
            out.print(f"[cyan]NO GATES[/] {escape(label)}")
    path = junit or root / OUT_DIR / "testlogs" / "junit.xml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(junit_xml(results, build_errors, outcome.seconds))
    gate_failed = any(not r.ok for rows in results.values() for r in rows)
    tally = sum(len(rows) for rows in results.values())
    out.print(f"{plural(tally, 'gate')} on {plural(len(results), 'target')}; JUnit XML: {path}")
    if build_code or build_errors:
        raise typer.Exit(1)
    if gate_failed:
        raise typer.Exit(3)


def _finish_build(store, outcome) -> int:
    """Print the summary, the errors and the verdict; the exit code."""
    from npubuild.report import counts, render_build

    render_build(out, store, outcome)
    tally = ", ".join(f"{n} {k}" for k, n in sorted(counts(outcome).items()))
    for line in outcome.errors:
        err.print(f"[red]error:[/] {escape(line)}", soft_wrap=True)
    if options.verbose:
        for r in outcome.results.values():
            if r.traceback:
                err.print(escape(r.traceback))
    for note in outcome.warnings:
        err.print(f"[yellow]warning:[/] {escape(note)}", soft_wrap=True)
    downloaded = sum(1 for r in outcome.results.values() if r.downloaded)
    if downloaded:
        tally += f"; {downloaded} from the remote cache"
    verdict = "[green]Build OK[/]" if outcome.ok else "[red]Build FAILED[/]"
    out.print(f"{verdict}: {len(outcome.actions)} actions ({tally}) in {outcome.seconds:.2f}s")
    return 0 if outcome.ok else 1


def _noop_build(argv: list[str]) -> int | None:
    """`npubuild build PATTERNS [-j N] [-k]` when nothing has to run, answered before typer parses
    the command line: typer's first option conversion costs more than a whole no-op build. Any
    option not listed here, or any action that must run, returns None and typer takes over."""
    from npubuild.engine.build import NeedsExecution
    from npubuild.engine.run import build as run_build

    args = list(argv)
    global_values = {"--cache-dir": "cache_dir", "-C": "workspace", "--workspace": "workspace"}
    while args and args[0] in global_values and len(args) > 1:
        setattr(options, global_values[args.pop(0)], Path(args.pop(0)))
    if not args or args.pop(0) != "build":
        return None
    patterns, jobs, keep_going = [], os.cpu_count() or 1, False
    while args:
        arg = args.pop(0)
        if arg in ("--keep-going", "-k"):
            keep_going = True
        elif arg in ("--jobs", "-j") and args and args[0].isdigit() and int(args[0]) > 0:
            jobs = int(args.pop(0))
        elif arg.startswith("-"):
            return None
        else:
            patterns.append(arg)
    if not patterns:
        return None
    try:
        store = _store()
        outcome = run_build(_root(), store, patterns, jobs=jobs, keep_going=keep_going, execute=False)
    except (NeedsExecution, UserError, OSError):
        return None
    if not outcome.ok:
        return None
    return _finish_build(store, outcome)


@app.command()
def query(
    patterns: Annotated[list[str] | None, typer.Argument(help="Patterns to list (default //...).")] = None,
    deps: Annotated[str | None, typer.Option(help="Show what this label depends on.")] = None,
) -> None:
    """List targets, or the dependencies and build steps of one label."""
    ws = _workspace()
    if deps is not None:
        from npubuild.engine.plan import plan_targets

        (target,) = ws.resolve([deps])
        out.print(f"{target.label} ({target.kind}, {target.location})")
        for d in ws.deps(target):
            out.print(f"  depends on {d.label} ({d.kind})")
        for plan in plan_targets(ws, [deps]):
            for step, action in plan.steps:
                out.print(f"  step {step}: {action.stage} for {action.owner}")
        return
    rows = [(str(t.label), t.kind, str(t.location)) for t in ws.resolve(patterns or ["//..."])]
    widths = [max((len(r[i]) for r in rows), default=0) for i in range(2)]
    for label, kind, where in rows:
        out.print(f"{escape(label):<{widths[0]}}  {kind:<{widths[1]}}  {escape(where)}", soft_wrap=True)


@app.command()
def explain(label: Annotated[str, typer.Argument(help="The target to explain.")]) -> None:
    """For each step of the last build of LABEL: ran or cached, and which input changed."""
    from npubuild.engine import history
    from npubuild.labels import parse_label

    ws, store = _workspace(), _store()
    target = ws.target(parse_label(label))
    record = history.last(store, str(target.label))
    if record is None:
        raise UserError(
            f"no build of {target.label} recorded in this cache; run 'npubuild build {target.label}'"
        )
    out.print(f"[bold]{target.label}[/] ({target.kind}), last build:")
    for s in record["steps"]:
        why = s.get("why") or []
        out.print(f"  {s['step']:<22} {s['status']:<8} {s.get('key', '')[:12]}")
        for line in why:
            out.print(f"      {escape(line)}")
        if s.get("message"):
            out.print(f"      [red]{escape(s['message'])}[/]")


@app.command()
def clean(expunge: Annotated[bool, typer.Option(help="Also delete the whole cache.")] = False) -> None:
    """Remove npubuild-out/ (and with --expunge the cache)."""
    from npubuild.layout import OUT_DIR

    root = _root()
    target = root / OUT_DIR
    if target.is_symlink() or target.is_file():
        target.unlink()
    else:
        shutil.rmtree(target, ignore_errors=True)
    out.print(f"removed {target}")
    if expunge:
        from npubuild.cache.store import default_cache_dir
        from npubuild.cache.store import expunge as remove_cache

        directory = options.cache_dir or default_cache_dir()
        remove_cache(directory)  # without opening it: a damaged cache goes too
        out.print(f"removed cache {directory}")


@cache_app.command("stats")
def cache_stats() -> None:
    """Entries and bytes in the local cache."""
    store = _store()
    s = store.stats()
    out.print(f"cache {store.directory}")
    out.print(f"  artifacts (cas)     {s['cas']}")
    out.print(f"  action results (ac) {s['ac']}")
    out.print(f"  stat entries        {s['stat']}")
    out.print(f"  size                {s['bytes'] / 2**20:.1f} MiB")


def _parse_size(text: str) -> int:
    units = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
    value = text.strip().upper().removesuffix("IB").removesuffix("B")
    unit = value[-1:] if value[-1:] in units else ""
    try:
        number = float(value[: len(value) - len(unit)])
    except ValueError:
        number = -1.0
    if number < 0:
        raise UserError(f"--max-size must be a size such as 500M or 2G, not '{text}'")
    return int(number * units[unit])


@cache_app.command("gc")
def cache_gc(
    max_size: Annotated[str, typer.Option(help="Keep at most this much, e.g. 500M or 2G; LRU first out.")],
) -> None:
    """Shrink the local cache to a size, evicting the least recently used results."""
    limit = _parse_size(max_size)
    store = _store()
    r = store.gc(limit)
    out.print(
        f"kept {r['actions_kept']} action results ({r['bytes_kept'] / 2**20:.1f} MiB of artifacts); "
        f"evicted {r['actions_evicted']} results and {r['blobs_evicted']} artifacts "
        f"({r['bytes_evicted'] / 2**20:.1f} MiB)"
    )


def _click_exception_types() -> tuple[type, type]:
    """(ClickException, Abort) of the click typer runs on: typer 0.29 vendors its own copy and no
    longer depends on click, older ones use click itself; both are reachable through typer."""
    base = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException")
    return base, typer.Abort


def _terminated(signum, frame) -> None:
    raise KeyboardInterrupt  # so the build kills its workers and leaves the cache as it was


def main() -> None:
    import signal

    signal.signal(signal.SIGTERM, _terminated)
    try:
        code = _noop_build(sys.argv[1:])
        if code is None:
            options.cache_dir = options.workspace = None
            import npubuild.cli_inspect  # noqa: F401  (registers report, run, disasm: not on the no-op path)

            code = app(standalone_mode=False)
        if code == 130:  # typer's click turns Ctrl-C into this return value
            err.print("[red]interrupted[/]")
        sys.exit(code if isinstance(code, int) else 0)
    except UserError as exc:
        err.print(f"[red]error:[/] {escape(str(exc))}", soft_wrap=True)
        sys.exit(1)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        err.print("[red]interrupted[/]")
        sys.exit(130)
    except Exception as exc:
        click_exception, abort = _click_exception_types()
        if isinstance(exc, abort):
            err.print("[red]interrupted[/]")
            sys.exit(130)
        if isinstance(exc, click_exception):  # a usage error: bad option, missing argument
            err.print(f"[red]error:[/] {escape(exc.format_message())}", soft_wrap=True)
            sys.exit(exc.exit_code)
        if options.verbose:
            raise
        import sqlite3

        if isinstance(exc, sqlite3.Error):  # the cache index could not be written or read
            why = "No space left on device" if "full" in str(exc) else "the cache index failed"
            err.print(
                f"[red]error:[/] {why} ({escape(str(exc))}); the cache keeps what it held before "
                "('npubuild clean --expunge' starts it afresh)"
            )
            sys.exit(1)
        if isinstance(exc, OSError):  # a full disk, a read-only directory, a vanished file
            what = f" {exc.filename}" if exc.filename else ""
            err.print(f"[red]error:[/] cannot access{escape(what)}: {escape(exc.strerror or str(exc))}")
            sys.exit(1)
        err.print(
            f"[red]internal error:[/] {type(exc).__name__}: {escape(str(exc))} "
            "(rerun with --verbose for a traceback)"
        )
        sys.exit(1)
