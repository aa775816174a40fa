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
from rich.console import Console
from rich.markup import escape

from npubuild.errors import UserError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Declarative, incremental compiler that deploys ONNX models on NPUs.",
)
cache_app = typer.Typer(no_args_is_help=True, help="Inspect the local cache.")
app.add_typer(cache_app, name="cache")

# Wide enough for the summary table when output goes to a file or CI log (rich assumes 80).
_WIDTH = None if sys.stdout.isatty() else int(os.environ.get("COLUMNS", "160"))
# emoji=False: "//models:m: ..." in an error line is text, not the emoji code :m:
out = Console(highlight=False, emoji=False, width=_WIDTH)
err = Console(stderr=True, highlight=False, emoji=False)


class _Options:
    cache_dir: Path | None = None
    workspace: Path | None = None
    verbose: bool = False


options = _Options()


@app.callback()
def _main(
    cache_dir: Annotated[
        Path | None, typer.Option(help="Cache directory (default $NPUBUILD_CACHE or ~/.cache/npubuild).")
    ] = None,
    workspace: Annotated[
        Path | None, typer.Option("-C", "--workspace", help="Run as if started in this directory.")
    ] = None,
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="Show tracebacks of internal errors.")
    ] = False,
) -> None:
    options.cache_dir, options.workspace, options.verbose = cache_dir, workspace, verbose


def _root() -> Path:
    from npubuild.layout import find_root

    return find_root(options.workspace or Path.cwd())


def _workspace():
    from npubuild.workspace import Workspace

    return Workspace(_root())


def _store():
    from npubuild.cache.store import Store, default_cache_dir

    return Store(options.cache_dir or default_cache_dir())


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
        err.print(f"  {mark} {name} [dim]{result.seconds:.1f}s[/]")
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
    jobs: Annotated[int, typer.Option("--jobs", "-j", min=1)] = os.cpu_count() or 1,
) -> None:
    """Build, then check every npu_model's gates. Exit 0: all passed; 3: a gate failed; 1: build error."""
    from npubuild.engine.run import build as run_build
    from npubuild.gates import check
    from npubuild.gates import junit as junit_xml
    from npubuild.labels import parse_label
    from npubuild.layout import OUT_DIR
    from npubuild.report import summary_of

    root, store = _root(), _store()
    progress = _LiveProgress()
    try:
        outcome = run_build(root, store, patterns, jobs=jobs, keep_going=True, progress=progress)
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
        gates = ws.target(parse_label(label)).attrs.gates.model_dump()
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
    out.print(f"{tally} gates on {len(results)} targets; JUnit XML: {path}")
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
    for t in ws.resolve(patterns or ["//..."]):
        out.print(f"{t.label}\t{t.kind}\t{t.location}")


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
def report(
    label: Annotated[str, typer.Argument(help="An npu_model.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    html: Annotated[
        bool,
        typer.Option("--html", help="Write one self-contained HTML page (npubuild-out/.../report.html)."),
    ] = False,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Where --html writes.")] = None,
) -> None:
    """The report of LABEL's last build: accuracy per layer, mixed precision, and with --html everything."""
    import json

    from npubuild.engine import history
    from npubuild.labels import parse_label
    from npubuild.report import render_accuracy, render_search

    ws, store = _workspace(), _store()
    target = ws.target(parse_label(label))
    record = history.last(store, str(target.label)) or {"steps": []}

    def stage_output(stage: str, name: str) -> dict | None:
        step = next((s for s in record["steps"] if s["stage"] == stage and s.get("key")), None)
        entry = store.get_action(step["key"]) if step else None
        return store.read_json(entry["outputs"][name]) if entry is not None else None

    data = stage_output("evaluate", "report")
    if data is None:
        raise UserError(f"no accuracy report for {target.label}; run 'npubuild build {target.label}' first")
    extra = {
        stage: found
        for stage, name in (("sensitivity", "report"), ("search", "summary"))
        if (found := stage_output(stage, name)) is not None
    }
    if html:
        from npubuild.html_report import render
        from npubuild.layout import OUT_DIR

        pages = {"evaluate": data, **extra, "target": ws.target_spec(target).model_dump()}
        for stage, name in (("partition", "plan"), ("codegen", "summary"), ("simulate", "report")):
            if (found := stage_output(stage, name)) is not None:
                pages[stage] = found
        path = output or ws.root / OUT_DIR / target.label.package / target.label.name / "report.html"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(render(str(target.label), record["steps"], pages))
        out.print(f"wrote {path}")
    elif as_json:
        out.print_json(json.dumps({"accuracy": data, **extra}))
    else:
        render_search(out, extra.get("sensitivity"), extra.get("search"))
        render_accuracy(out, str(target.label), data)


def _binary_path(what: str) -> Path:
    """A .npub file, or the model.npub an npu_model's last build materialised."""
    path = Path(what)
    if what.endswith(".npub") or path.is_file():
        if not path.is_file():
            raise UserError(f"{what}: no such file")
        return path
    from npubuild.labels import parse_label
    from npubuild.layout import OUT_DIR

    ws = _workspace()
    target = ws.target(parse_label(what))
    if target.kind != "npu_model":
        raise UserError(f"{target.label} is a {target.kind}; 'run' takes an npu_model or a .npub file")
    found = ws.root / OUT_DIR / target.label.package / target.label.name / "model.npub"
    if not found.is_file():
        raise UserError(f"{target.label} has no binary yet; run 'npubuild build {target.label}' first")
    return found


def _read_input(file: str):
    """One --input array: a .npy of numbers, nothing else (no pickle, no archive, not empty)."""
    import numpy as np

    try:
        loaded = np.load(file, allow_pickle=False)
    except FileNotFoundError:
        raise UserError(f"--input {file}: no such file") from None
    except (OSError, ValueError, EOFError) as exc:
        raise UserError(f"--input {file}: not a .npy array ({exc})") from None
    if not isinstance(loaded, np.ndarray):
        loaded.close()
        raise UserError(f"--input {file}: a .npz holds several arrays; pass each as NAME=file.npy")
    if loaded.size == 0:
        raise UserError(f"--input {file}: the array is empty (shape {list(loaded.shape)})")
    return loaded


@app.command()
def run(
    what: Annotated[str, typer.Argument(help="An npu_model label or a .npub file.")],
    inputs: Annotated[
        list[str], typer.Option("--input", "-i", help="x.npy, or NAME=x.npy for a model with several inputs.")
    ],
    output: Annotated[
        Path, typer.Option("--output", "-o", help="Directory for the output .npy files.")
    ] = Path("."),
) -> None:
    """Execute a .npub (NPU parts in the simulator, CPU parts in onnxruntime); write its outputs."""
    import numpy as np

    from npubuild.targets.runtime import Runtime, load

    runtime = Runtime(load(_binary_path(what)))
    names = [spec["name"] for spec in runtime.inputs]
    feeds = {}
    for k, item in enumerate(inputs):
        name, _, file = item.rpartition("=") if "=" in item else (None, "", item)
        if name is None:
            if k >= len(names):
                raise UserError(f"--input {item}: the model takes {len(names)} input(s): {', '.join(names)}")
            name = names[k]
        if name not in names:
            raise UserError(f"--input {item}: the model has no input '{name}' (inputs: {', '.join(names)})")
        feeds[name] = _read_input(file)
    if output.exists() and not output.is_dir():
        raise UserError(f"--output {output}: is a file; give a directory for the output .npy files")
    results = runtime.run(feeds)
    output.mkdir(parents=True, exist_ok=True)
    for name, value in results.items():
        safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in name)
        np.save(output / f"{safe}.npy", value, allow_pickle=False)
        out.print(f"{escape(name)}: {value.dtype} {list(value.shape)} -> {output / (safe + '.npy')}")


@app.command()
def disasm(file: Annotated[Path, typer.Argument(help="A .npub file.")]) -> None:
    """Print the listing of a .npub: header, subgraphs and every instruction."""
    from npubuild.targets.disasm import disassemble
    from npubuild.targets.runtime import load

    sys.stdout.write(disassemble(load(file)))


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
