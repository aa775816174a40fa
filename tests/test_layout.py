"""The tree's import direction (docs/tree.md): cli -> engine -> stages -> targets -> intmodel ->
cache, labels, errors; no import cycles. Read from the source, as the stage code versions are."""

from __future__ import annotations

from conftest import REPO
from npubuild.stages import codeversion

GRAPH = codeversion.import_graph(codeversion.module_files(REPO / "npubuild"))

# Each layer may import only the layers after it (and itself).
LAYERS = [
    ("npubuild.cli",),
    ("npubuild.engine", "npubuild.report", "npubuild.html_report", "npubuild.gates"),
    ("npubuild.workspace", "npubuild.rules", "npubuild.buildlang", "npubuild.layout"),
    ("npubuild.stages",),
    ("npubuild.targets",),
    ("npubuild.intmodel",),
    ("npubuild.cache",),
    ("npubuild.labels", "npubuild.errors"),
]


def _layer(module: str) -> int | None:
    for i, prefixes in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return i
    return None


def _edges():
    for module, imports in GRAPH.items():
        for imported in imports:
            if module.startswith(imported + "."):
                continue  # importing a module runs its parent packages: not a dependency
            yield module, imported


def test_imports_go_downward_only():
    upward = []
    for module, imported in _edges():
        here, there = _layer(module), _layer(imported)
        if here is not None and there is not None and there < here:
            upward.append(f"{module} -> {imported}")
    assert not upward, upward


def test_the_back_end_and_the_integer_model_import_no_stage():
    for module, imported in _edges():
        if module.startswith(("npubuild.targets", "npubuild.intmodel")):
            assert not imported.startswith("npubuild.stages"), f"{module} -> {imported}"


def test_no_import_cycles():
    graph: dict[str, set[str]] = {m: set() for m in GRAPH}
    for module, imported in _edges():
        graph[module].add(imported)
    state: dict[str, int] = {}  # 1 on the path, 2 done

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for imported in sorted(graph[module]):
            if state.get(imported) == 1:
                cycle = path[path.index(imported) :] + [imported]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if imported not in state:
                visit(imported, path + [imported])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])


def test_no_module_is_over_600_lines():
    """A module that grows past this holds more than one job (docs/tree.md): split it."""
    long = {
        str(path.relative_to(REPO)): n
        for path in sorted((REPO / "npubuild").rglob("*.py"))
        if (n := len(path.read_text().splitlines())) > 600
    }
    assert not long, long
