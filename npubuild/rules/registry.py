"""The functions a BUILD file calls: each validates its attributes and records a target."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from npubuild.buildlang import Arg, Builtin
from npubuild.errors import Location, UserError
from npubuild.labels import Label, _check_name
from npubuild.layout import glob_files
from npubuild.rules.attrs import DatasetAttrs, NpuModelAttrs, NpuTargetAttrs, OnnxModelAttrs, PypiFile


@dataclass
class Target:
    label: Label
    kind: str
    attrs: Any
    location: Location
    attr_locations: dict[str, Location] = field(default_factory=dict)

    def where(self, attr: str) -> Location:
        return self.attr_locations.get(attr, self.location)


RULES: dict[str, type[BaseModel]] = {
    "onnx_model": OnnxModelAttrs,
    "dataset": DatasetAttrs,
    "npu_model": NpuModelAttrs,
    "npu_target": NpuTargetAttrs,
}


def validate(schema: type[BaseModel], what: str, kwargs: dict[str, Arg], location: Location) -> BaseModel:
    """Validate keyword Args against a schema; the first error is reported at its attribute's line."""
    values = {k: a.value for k, a in kwargs.items()}
    try:
        return schema.model_validate(values)
    except ValidationError as exc:
        err = exc.errors()[0]
        path = [str(p) for p in err["loc"]]
        attr = path[0] if path else ""
        where = kwargs[attr].location if attr in kwargs else location
        if err["type"] == "extra_forbidden" and len(path) == 1:
            known = ", ".join(schema.model_fields)
            raise UserError(f"{what}: unknown attribute '{attr}' (known: {known})", where) from None
        if err["type"] == "missing" and len(path) == 1:
            raise UserError(f"{what}: missing required attribute '{attr}'", where) from None
        msg = err["msg"]
        dotted = ".".join(path)
        if err["type"] == "extra_forbidden":
            msg = "unknown field"
        raise UserError(
            f"{what}: attribute '{dotted}': {msg} (got {_short(err.get('input'))})", where
        ) from None


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def package_builtins(
    package: str, package_dir: Path, targets: dict[str, Target], globs: list | None = None
) -> dict[str, Builtin]:
    """The built-in functions for one package; rule calls add to `targets`."""

    def make_rule(kind: str, schema: type[BaseModel]) -> Builtin:
        def rule(args: list[Any], kwargs: dict[str, Arg], location: Location) -> None:
            if args:
                raise UserError(f"{kind}() takes keyword arguments only", location)
            name_arg = kwargs.get("name")
            if name_arg is None:
                raise UserError(f"{kind}: missing required attribute 'name'", location)
            if not isinstance(name_arg.value, str):
                raise UserError(f"{kind}: attribute 'name' must be a string", name_arg.location)
            try:
                _check_name(name_arg.value, name_arg.value)
            except UserError as exc:
                raise UserError(exc.message, name_arg.location) from None
            label = Label(package, name_arg.value)
            attrs = validate(schema, f"{kind} {label}", kwargs, location)
            if label.name in targets:
                first = targets[label.name].location
                raise UserError(f"duplicate target '{label.name}' (first defined at {first})", location)
            targets[label.name] = Target(
                label, kind, attrs, location, {k: a.location for k, a in kwargs.items()}
            )

        return rule

    def glob(args: list[Any], kwargs: dict[str, Arg], location: Location) -> list[str]:
        include = args[0] if args else (kwargs["include"].value if "include" in kwargs else None)
        exclude = kwargs["exclude"].value if "exclude" in kwargs else (args[1] if len(args) > 1 else [])
        extra = set(kwargs) - {"include", "exclude"}
        if extra or not isinstance(include, list) or not isinstance(exclude, list):
            raise UserError("glob(include, exclude=[]) takes two lists of patterns", location)
        found = glob_files(package_dir, include, exclude, location)
        if globs is not None:
            globs.append([package, include, exclude, found])
        return found

    def pypi_file(args: list[Any], kwargs: dict[str, Arg], location: Location) -> PypiFile:
        if args:
            raise UserError("pypi_file() takes keyword arguments only", location)
        if "sha256" not in kwargs:
            raise UserError(_missing_sha256(kwargs), location)
        return validate(PypiFile, "pypi_file", kwargs, location)  # type: ignore[return-value]

    builtins: dict[str, Builtin] = {kind: make_rule(kind, schema) for kind, schema in RULES.items()}
    builtins["glob"] = glob
    builtins["pypi_file"] = pypi_file
    return builtins


def _missing_sha256(kwargs: dict[str, Arg]) -> str:
    """The error for a pypi_file without its pin, with the commands that print the digest."""
    value = {k: a.value if isinstance(a.value, str) else "" for k, a in kwargs.items()}
    package, version = value.get("package") or "PACKAGE", value.get("version") or "VERSION"
    path = value.get("path") or "PATH/IN/WHEEL"
    wheel = f"{re.sub(r'[-.]+', '_', package)}-{version}-*.whl"
    return (
        "pypi_file: missing required attribute 'sha256' (the SHA-256 of the file itself, which pins it); "
        f"print it with: pip download {package}=={version} --no-deps -d wheels && "
        f"unzip -p wheels/{wheel} {path} | sha256sum"
    )


RuleFunction = Callable[[list[Any], dict[str, Arg], Location], Any]
