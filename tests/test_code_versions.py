"""Stage code versions come from the code: the import closure of each stage's module."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, cli, make_small_ws
from npubuild.stages import STAGES, codeversion

PACKAGE = REPO / "npubuild"


def _loaded_modules(module: str) -> set[str]:
    """The npubuild modules a fresh interpreter really loads when it imports `module`."""
    code = (
        "import importlib, json, sys; importlib.import_module(sys.argv[1]); "
        "print(json.dumps(sorted(m for m in sys.modules if m == 'npubuild' or m.startswith('npubuild.'))))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, module], capture_output=True, text=True, check=True, cwd=REPO
    )
    return set(json.loads(proc.stdout))


def test_the_static_closure_holds_every_module_a_stage_really_loads():
    graph = codeversion.import_graph(codeversion.module_files(PACKAGE))
    for info in STAGES.values():
        closure = codeversion.import_closure(graph, info.module)
        missing = _loaded_modules(info.module) - closure
        assert not missing, f"{info.name}: loads {sorted(missing)} outside its computed closure"


def _copy_package(dest: Path) -> Path:
    shutil.copytree(PACKAGE, dest / "npubuild", ignore=shutil.ignore_patterns("__pycache__"))
    return dest / "npubuild"


def test_editing_a_module_changes_exactly_the_stages_whose_closure_holds_it(tmp_path):
    package = _copy_package(tmp_path)
    modules = codeversion.module_files(package)
    graph = codeversion.import_graph(modules)
    closures = {name: codeversion.import_closure(graph, info.module) for name, info in STAGES.items()}
    before = codeversion.compute_versions(STAGES, package)
    # The modules the old hand-kept list missed, plus a few that no stage may depend on.
    named = {
        "npubuild.stages.importer": {"import"},
        "npubuild.stages.calibrate": {"calibrate"},
        "npubuild.stages.prepare": {"prepare"},
        "npubuild.cli": set(),
        "npubuild.engine.build": set(),
    }
    for module in sorted(modules):
        path = modules[module]
        original = path.read_bytes()
        path.write_bytes(original + b"\n# an edit\n")
        try:
            after = codeversion.compute_versions(STAGES, package)
        finally:
            path.write_bytes(original)
        changed = {name for name in STAGES if after[name] != before[name]}
        assert changed == {name for name, c in closures.items() if module in c}, module
        if module in named:
            assert named[module] <= changed and (named[module] or not changed), (module, changed)
    # The integer-model loader (once in evaluate.py, which the hand-kept list missed for the back
    # end) is used by partition, codegen and simulate: its edits must reach them.
    for stage in ("partition", "codegen", "simulate"):
        assert "npubuild.intmodel.interpreter" in closures[stage]


def test_the_versions_cover_the_libraries_stages_compute_with():
    assert set(codeversion.library_versions()) == {"numpy", "onnx", "onnxruntime", "Pillow"}


@pytest.mark.slow
def test_editing_the_importer_reruns_import_through_the_cli(tmp_path, cls_model):
    """The reproduction of the stale-result bug: build --until import, edit importer.py, rebuild."""
    ws = make_small_ws(tmp_path / "ws", cls_model)
    package = _copy_package(tmp_path / "site")
    env = {"PYTHONPATH": str(tmp_path / "site")}  # the copy, which this test edits

    def build() -> str:
        args = ["build", "//models:cls_npu", "--until", "import", "-j", "1"]
        proc = cli(args, ws, tmp_path / "cache", env=env)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.strip().splitlines()[-1]

    assert "(1 ran)" in build()
    assert "(1 cached)" in build()
    importer = package / "stages" / "importer.py"
    importer.write_text(importer.read_text() + "\n# a comment\n")
    assert "(1 ran)" in build()
    cli_module = package / "cli.py"
    cli_module.write_text(cli_module.read_text() + "\n# a comment\n")
    assert "(1 cached)" in build()
