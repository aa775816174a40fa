"""What every `npubuild` command shares: the typer app, the consoles, the global options and how
a command finds its workspace and cache. Light: no onnx, onnxruntime or numpy."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console


def _hide_flag_types() -> None:
    """Show flags as flags: typer 0.29's help prints '<bool>' after every on/off option (as if it
    took a value), including --help itself. Kept only where typer has the method we override."""
    from typer.core import TyperOption

    shown = getattr(TyperOption, "display_type_rich", None)
    if shown is None:
        return

    def display_type_rich(self, ctx):
        return None if getattr(self, "is_flag", False) else shown(self, ctx)

    TyperOption.display_type_rich = display_type_rich


_hide_flag_types()

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
    """The command's cache, closed as the process exits: a cache that could not be written was
    replaced by a private one (cache/store.py), which closing deletes."""
    import atexit

    from npubuild.cache.store import Store, default_cache_dir

    store = Store(options.cache_dir or default_cache_dir())
    atexit.register(store.close)
    return store
