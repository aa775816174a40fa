"""The commands that look at what a build made: `report`, `run` and `disasm`. Each takes an
npu_model's label or a file the build wrote (its model.npub, or any file in its output directory),
so a user can paste either."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from npubuild.cli_common import _store, _workspace, app, out
from npubuild.errors import UserError


def _output_dir(ws, target) -> Path:
    from npubuild.layout import OUT_DIR

    return ws.root / OUT_DIR / target.label.out_dir


def _model_target(ws, what: str, command: str):
    """The npu_model WHAT names: a label, or a path into npubuild-out/PACKAGE/NAME/."""
    from npubuild.labels import Label, parse_label
    from npubuild.layout import OUT_DIR

    if what.startswith("//") or what.startswith(":"):
        label = parse_label(what if what.startswith("//") else f"//{what}")
    else:
        path = Path(what).resolve()
        out_root = (ws.root / OUT_DIR).resolve()
        if not path.exists():
            raise UserError(f"{what}: no such file, and not a label (labels look like //package:name)")
        if not path.is_relative_to(out_root) or len(path.relative_to(out_root).parts) < 2:
            raise UserError(
                f"{what}: not a label and not inside this workspace's {OUT_DIR}/; "
                f"'{command}' takes an npu_model label such as //models:name"
            )
        parts = path.relative_to(out_root).parts
        if path.is_file():
            parts = parts[:-1]
        label = Label("/".join(parts[:-1]), parts[-1])
    target = ws.target(label)
    if target.kind != "npu_model":
        models = [str(t.label) for t in ws.resolve(["//..."]) if t.kind == "npu_model"]
        shown = ", ".join(models[:6]) + (", ..." if len(models) > 6 else "")
        hint = f" such as {shown}" if models else ""
        raise UserError(f"{target.label} is a {target.kind}; '{command}' takes an npu_model{hint}")
    return target


def _binary_path(what: str, command: str) -> tuple[Path, object | None]:
    """A .npub file, or the model.npub an npu_model's last build wrote; with the npu_model when
    WHAT names one (a label, or a file in its output directory)."""
    path = Path(what)
    if path.suffix == ".npub" or path.is_file():
        if not path.is_file():
            raise UserError(f"{what}: no such file")
        try:
            ws = _workspace()
            return path, _model_target(ws, what, command)
        except UserError:
            return path, None  # a .npub from elsewhere: runs, but has no data set of its own
    ws = _workspace()
    target = _model_target(ws, what, command)
    found = _output_dir(ws, target) / "model.npub"
    if not found.is_file():
        raise UserError(f"{target.label} has no binary yet; run 'npubuild build {target.label}' first")
    return found, target


# The summary each stage's report reads, by the name of its output.
_SUMMARIES = {
    "optimize": "summary",
    "evaluate": "report",
    "sensitivity": "report",
    "search": "summary",
    "partition": "plan",
    "codegen": "summary",
    "simulate": "report",
}


def _last_build(store, label: str) -> tuple[list[dict], dict[str, dict]]:
    """The steps of LABEL's last build and each stage's summary, read (and checked) from the cache."""
    from npubuild.cache.store import CorruptBlob
    from npubuild.engine import history

    record = history.last(store, label) or {"steps": []}
    summaries = {}
    for step in record["steps"]:
        name = _SUMMARIES.get(step["stage"])
        entry = store.get_action(step["key"]) if name and step.get("key") else None
        if entry is not None and name in entry["outputs"]:
            try:
                summaries[step["stage"]] = store.read_json(entry["outputs"][name])
            except (CorruptBlob, KeyError):
                pass  # evicted or damaged: that column shows '-'
    return record["steps"], summaries


def _is_pattern(text: str) -> bool:
    return text.endswith("...") or text.endswith(":all") or text.endswith(":*")


@app.command()
def report(
    label: Annotated[
        str,
        typer.Argument(
            help="An npu_model label or a file in its npubuild-out/ directory; or a pattern "
            "(//..., //pkg:all) for one line per npu_model."
        ),
    ],
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    html: Annotated[
        bool,
        typer.Option("--html", help="Write self-contained HTML (npubuild-out/.../report.html)."),
    ] = False,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Where --html writes.")] = None,
) -> None:
    """The report of LABEL's last build: accuracy per layer, mixed precision, and with --html everything."""
    import json

    from npubuild.report import render_accuracy, render_details, render_search

    ws, store = _workspace(), _store()
    if _is_pattern(label):
        _overview(ws, store, label, as_json, html, output)
        return
    target = _model_target(ws, label, "report")
    steps, summaries = _last_build(store, str(target.label))
    data = summaries.get("evaluate")
    if data is None:
        raise UserError(f"no accuracy report for {target.label}; run 'npubuild build {target.label}' first")
    extra = {k: summaries[k] for k in ("sensitivity", "search") if k in summaries}
    if html:
        path = output or _model_page(ws, target)
        _write_model_page(ws, target, steps, summaries, path)
        out.print(f"wrote {path}")
    elif as_json:
        out.print_json(json.dumps({"accuracy": data, **extra}))
    else:
        render_search(out, extra.get("sensitivity"), extra.get("search"))
        render_accuracy(out, str(target.label), data)
        render_details(out, str(target.label), summaries)


def _model_page(ws, target) -> Path:
    return _output_dir(ws, target) / "report.html"


def _write_model_page(ws, target, steps: list[dict], summaries: dict[str, dict], path: Path) -> None:
    from npubuild.html_report import render

    pages = {**summaries, "target": ws.target_spec(target).model_dump()}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render(str(target.label), steps, pages))


def _overview(ws, store, pattern: str, as_json: bool, html: bool, output: Path | None) -> None:
    """`report //...`: one line per npu_model from the cache alone (no build), and with --html a
    dashboard page linking each model's own page."""
    import json

    from npubuild.layout import OUT_DIR
    from npubuild.overview import COLUMNS, model_figures, print_rows

    models = [t for t in ws.resolve([pattern]) if t.kind == "npu_model"]
    if not models:
        raise UserError(f"pattern '{pattern}' matches no npu_model")
    rows = []
    for target in models:
        steps, summaries = _last_build(store, str(target.label))
        gates = target.attrs.gates.declared()
        statuses = {s["status"] for s in steps}
        if not steps:
            state = "never built"
        elif statuses - {"ran", "cached"}:
            state = "FAILED"
        else:
            state = "rebuilt" if "ran" in statuses else "cached"
        rows.append({"label": str(target.label), "last build": state, **model_figures(summaries, gates)})
        if html and "evaluate" in summaries:
            _write_model_page(ws, target, steps, summaries, _model_page(ws, target))
    if as_json:
        out.print_json(json.dumps(rows))
        return
    if html:
        from npubuild.html_report import render_dashboard

        path = output or ws.root / OUT_DIR / "report.html"
        pages = {str(t.label): _model_page(ws, t) for t in models}
        links = {
            label: os.path.relpath(page, path.parent.resolve()) if page.is_file() else None
            for label, page in pages.items()
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(render_dashboard(rows, links))
        out.print(f"wrote {path}")
        return
    cells = [[escape(r[c]) for c in ("label", "last build", *COLUMNS)] for r in rows]
    print_rows(out, ["npu_model", "last build", *COLUMNS], cells)


def _read_input(file: str):
    """One --input array: a .npy of numbers, nothing else (no pickle, no archive, not empty)."""
    import numpy as np

    from npubuild.layout import IMAGE_SUFFIXES  # what `run --image` decodes

    if Path(file).suffix.lower() in IMAGE_SUFFIXES:
        raise UserError(
            f"--input {file}: an image, not a .npy array; pass it as --image {file} to apply the "
            "npu_model's calibration preprocessing"
        )
    try:
        with open(file, "rb") as f:
            magic = f.read(6)
    except FileNotFoundError:
        raise UserError(f"--input {file}: no such file") from None
    except OSError as exc:
        raise UserError(f"--input {file}: cannot read ({exc.strerror})") from None
    if magic != b"\x93NUMPY" and not magic.startswith(b"PK\x03\x04"):
        raise UserError(f"--input {file}: not a .npy array (no .npy header); save one with numpy.save")
    try:
        loaded = np.load(file, allow_pickle=False)
    except (OSError, ValueError, EOFError) as exc:
        reason = "it holds Python objects, which are never unpickled" if "pickle" in str(exc) else exc
        raise UserError(f"--input {file}: not a readable .npy array ({reason})") from None
    if not isinstance(loaded, np.ndarray):
        loaded.close()
        raise UserError(f"--input {file}: a .npz holds several arrays; pass each as NAME=file.npy")
    if loaded.size == 0:
        raise UserError(f"--input {file}: the array is empty (shape {list(loaded.shape)})")
    return loaded


def _read_image(file: str, target, ws):
    """One --image: decoded and preprocessed exactly as the npu_model's calibration set is (with
    fuse_preprocess, only decoded and resized: the binary takes the pixels as uint8)."""
    import numpy as np

    from npubuild.stages.prepare import _image

    if target is None:
        raise UserError(
            f"--image {file}: this .npub is not an npu_model's output, so no preprocessing is known; "
            "give the npu_model's label, or a .npy array with --input"
        )
    if not Path(file).is_file():
        raise UserError(f"--image {file}: no such file")
    if not target.attrs.calibration:
        raise UserError(
            f"--image {file}: {target.label} declares no calibration data set to take preprocessing from"
        )
    preprocess = ws.dep(target, "calibration", ("dataset",)).attrs.preprocess
    if target.attrs.fuse_preprocess:
        return _image(Path(file), file, preprocess.pixels().model_dump())[None].astype(np.uint8)
    return _image(Path(file), file, preprocess.model_dump())[None]


@app.command()
def run(
    what: Annotated[str, typer.Argument(help="An npu_model label or a .npub file.")],
    inputs: Annotated[
        list[str] | None,
        typer.Option("--input", "-i", help="x.npy, or NAME=x.npy for a model with several inputs."),
    ] = None,
    images: Annotated[
        list[str] | None,
        typer.Option(
            "--image", help="A photo, preprocessed as the model's calibration set (NAME=photo.jpg also)."
        ),
    ] = None,
    output: Annotated[
        Path, typer.Option("--output", "-o", help="Directory for the output .npy files.")
    ] = Path("."),
) -> None:
    """Execute a .npub (NPU parts in the simulator, CPU parts in onnxruntime); write its outputs."""
    import numpy as np

    from npubuild.targets.runtime import Runtime, load

    if not inputs and not images:
        raise UserError("run needs --input x.npy or --image photo.jpg (one per model input)")
    binary, target = _binary_path(what, "run")
    runtime = Runtime(load(binary))
    names = [spec["name"] for spec in runtime.inputs]
    feeds = {}
    given = [(item, "--input") for item in inputs or []] + [(item, "--image") for item in images or []]
    for k, (item, flag) in enumerate(given):
        name, _, file = item.rpartition("=") if "=" in item else (None, "", item)
        if name is None:
            if k >= len(names):
                raise UserError(f"{flag} {item}: the model takes {len(names)} input(s): {', '.join(names)}")
            name = names[k]
        if name not in names:
            raise UserError(f"{flag} {item}: the model has no input '{name}' (inputs: {', '.join(names)})")
        feeds[name] = _read_input(file) if flag == "--input" else _read_image(file, target, _workspace())
    if output.exists() and not output.is_dir():
        raise UserError(f"--output {output}: is a file; give a directory for the output .npy files")
    results = runtime.run(feeds)
    output.mkdir(parents=True, exist_ok=True)
    for name, value in results.items():
        safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in name)
        np.save(output / f"{safe}.npy", value, allow_pickle=False)
        out.print(f"{escape(name)}: {value.dtype} {list(value.shape)} -> {output / (safe + '.npy')}")


@app.command()
def disasm(
    what: Annotated[str, typer.Argument(help="An npu_model label or a .npub file.")],
) -> None:
    """Print the listing of a .npub: header, subgraphs and every instruction."""
    from npubuild.targets.disasm import disassemble
    from npubuild.targets.runtime import load

    binary, _ = _binary_path(what, "disasm")
    sys.stdout.write(disassemble(load(binary)))
