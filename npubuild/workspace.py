"""Finding the workspace, loading BUILD files into targets, resolving labels and patterns."""

from __future__ import annotations

import os
from pathlib import Path

from npubuild.buildlang import evaluate
from npubuild.errors import Location, UserError
from npubuild.labels import Label, Pattern, parse_label, parse_pattern
from npubuild.layout import BUILD_FILE, OUT_DIR, build_file, find_root, list_packages, package_dir
from npubuild.rules.registry import Target, package_builtins
from npubuild.targets.spec import BUILTIN_TARGETS, TargetSpec

__all__ = ["OUT_DIR", "Workspace", "find_root"]


class Workspace:
    def __init__(self, root: Path):
        self.root = root
        self._packages: dict[str, dict[str, Target]] = {}
        self._all_packages: list[str] | None = None
        # What the analysis read, so a cached analysis can be checked cheaply later.
        self.loaded_build_files: list[str] = []
        self.globs: list = []
        self.walked = False

    # packages ---------------------------------------------------------------------------------
    def all_packages(self) -> list[str]:
        if self._all_packages is None:
            self._all_packages = list_packages(self.root)
            self.walked = True
        return self._all_packages

    def package_dir(self, package: str) -> Path:
        return package_dir(self.root, package)

    def build_file(self, package: str) -> str:
        return build_file(package)

    def load_package(self, package: str) -> dict[str, Target]:
        if package in self._packages:
            return self._packages[package]
        path = self.package_dir(package) / BUILD_FILE
        try:
            source = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise UserError(f"no package '//{package}': {self.build_file(package)} does not exist") from None
        except UnicodeDecodeError:
            raise UserError("BUILD file is not UTF-8 text", Location(self.build_file(package))) from None
        targets: dict[str, Target] = {}
        self.loaded_build_files.append(self.build_file(package))
        builtins = package_builtins(package, self.package_dir(package), targets, self.globs)
        loaded = evaluate(source, self.build_file(package), builtins, self.root, self.package_dir(package))
        self.loaded_build_files += [rel for rel in loaded if rel not in self.loaded_build_files]
        self._packages[package] = targets
        return targets

    # labels and patterns ----------------------------------------------------------------------
    def target(self, label: Label, referenced_at: Location | None = None) -> Target:
        try:
            targets = self.load_package(label.package)
        except UserError as exc:
            if referenced_at is None or exc.location is not None:
                raise
            raise UserError(f"{exc.message} (referenced as {label})", referenced_at) from None
        if label.name not in targets:
            known = ", ".join(sorted(targets)) or "none"
            raise UserError(
                f"no target '{label.name}' in package '//{label.package}' (targets: {known})", referenced_at
            )
        return targets[label.name]

    def resolve(self, patterns: list[str]) -> list[Target]:
        selected: dict[Label, Target] = {}
        for text in patterns:
            pattern = parse_pattern(text)
            hits = self._expand(pattern)
            if not hits:
                raise UserError(f"pattern '{text}' matches no target")
            for t in hits:
                selected[t.label] = t
        return [selected[k] for k in sorted(selected)]

    def _expand(self, pattern: Pattern) -> list[Target]:
        if pattern.name is not None:
            return [self.target(Label(pattern.package, pattern.name))]
        if pattern.recursive:
            packages = [p for p in self.all_packages() if pattern.matches(Label(p, "x"))]
        else:
            self.load_package(pattern.package)
            packages = [pattern.package]
        return [t for p in packages for _, t in sorted(self.load_package(p).items())]

    def dep(self, owner: Target, attr: str, kinds: tuple[str, ...]) -> Target:
        """The target an attribute of `owner` names, checked to be one of `kinds`."""
        where = owner.where(attr)
        text = getattr(owner.attrs, attr)
        try:
            label = parse_label(text, owner.label.package)
        except UserError as exc:
            raise UserError(f"{owner.kind} {owner.label}: attribute '{attr}': {exc.message}", where) from None
        dep = self.target(label, where)
        if dep.kind not in kinds:
            raise UserError(
                f"{owner.kind} {owner.label}: attribute '{attr}' must name a {' or '.join(kinds)}, "
                f"but {label} is a {dep.kind}",
                where,
            )
        return dep

    def deps(self, target: Target) -> list[Target]:
        if target.kind == "npu_model":
            found = [self.dep(target, "model", ("onnx_model",))]
            if target.attrs.calibration:
                found.append(self.dep(target, "calibration", ("dataset",)))
            if target.attrs.evaluation:
                found.append(self.dep(target, "evaluation", ("dataset",)))
            if target.attrs.target not in BUILTIN_TARGETS:
                found.append(self.hardware(target, "target"))
            return found
        if target.kind == "npu_target" and target.attrs.base not in BUILTIN_TARGETS:
            return [self.hardware(target, "base")]
        return []

    def hardware(self, owner: Target, attr: str) -> Target:
        """The npu_target that `target` (of an npu_model) or `base` (of an npu_target) names when it
        is not a built-in; a bare name that is neither is taken for a mistyped built-in."""
        text = getattr(owner.attrs, attr)
        try:
            return self.dep(owner, attr, ("npu_target",))
        except UserError as exc:
            if ":" in text or "/" in text or not exc.message.startswith("no target"):
                raise
            import difflib

            known = sorted(BUILTIN_TARGETS)
            close = difflib.get_close_matches(text, known, n=1)
            hint = f"did you mean '{close[0]}'? " if close else ""
            raise UserError(
                f"{owner.kind} {owner.label}: attribute '{attr}': no built-in target '{text}' ({hint}"
                f"built-in targets: {', '.join(known)}; or the label of an npu_target, e.g. ':my_npu')",
                owner.where(attr),
            ) from None

    def check_acyclic(self, roots: list[Target]) -> None:
        state: dict[Label, int] = {}  # 1 visiting, 2 done

        def visit(t: Target, path: list[Target]) -> None:
            if state.get(t.label) == 2:
                return
            if state.get(t.label) == 1:
                cycle = " -> ".join(str(p.label) for p in path[path.index(t) :] + [t])
                raise UserError(f"dependency cycle: {cycle}", t.location)
            state[t.label] = 1
            for d in self.deps(t):
                visit(d, path + [t])
            state[t.label] = 2

        for r in roots:
            visit(r, [])

    def target_spec(self, target: Target) -> TargetSpec:
        """The hardware spec an npu_model or npu_target names (a built-in, or derived in BUILD)."""
        if target.kind == "npu_model":
            name = target.attrs.target
            if name in BUILTIN_TARGETS:
                return BUILTIN_TARGETS[name]
            return self.target_spec(self.hardware(target, "target"))
        base_name = target.attrs.base
        base = (
            BUILTIN_TARGETS[base_name]
            if base_name in BUILTIN_TARGETS
            else self.target_spec(self.hardware(target, "base"))
        )
        fields = dict(target.attrs.model_extra or {})
        from pydantic import ValidationError

        try:
            return TargetSpec.model_validate({**base.model_dump(), **fields, "name": str(target.label)})
        except ValidationError as exc:
            err = exc.errors()[0]
            attr = str(err["loc"][0]) if err["loc"] else "base"
            raise UserError(
                f"npu_target {target.label}: attribute '{attr}': {err['msg']}", target.where(attr)
            ) from None

    def source_path(self, target: Target, rel: str, attr: str) -> Path:
        if rel.startswith("/") or ".." in rel.split("/"):
            raise UserError(
                f"{target.kind} {target.label}: source '{rel}' must stay inside the package",
                target.where(attr),
            )
        path = self.package_dir(target.label.package) / rel
        if not path.is_file():
            raise UserError(
                f"{target.kind} {target.label}: source file '{rel}' does not exist", target.where(attr)
            )
        real, root = os.path.realpath(path), os.path.realpath(self.root)
        if os.path.commonpath([real, root]) != root:
            raise UserError(
                f"{target.kind} {target.label}: source '{rel}' is a symlink to {real}, outside the "
                "workspace; copy the file in (a build reads only the workspace)",
                target.where(attr),
            )
        return path
