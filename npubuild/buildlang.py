"""A safe evaluator for BUILD files: a Starlark subset walked from Python's AST, never exec/eval.

Supported: rule calls with keyword arguments, literals, lists, tuples, dicts, variables, `+`
(strings and lists), `*` (string/list repetition, numbers), `%` and `.format()` string formatting,
f-strings, `.join()`, indexing with a constant, unary minus, and the built-ins the rule set provides
(`glob`, `pypi_file`, ...). Everything else is an error at its file:line:col.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from npubuild.errors import Location, UserError


@dataclass(frozen=True)
class Arg:
    """A keyword argument's value with where it was written, so validation errors can point at it."""

    value: Any
    location: Location


# A builtin receives (positional values, keyword Args, location of the call) and returns a value.
Builtin = Callable[[list[Any], dict[str, Arg], Location], Any]

_STR_METHODS = {"format", "join", "upper", "lower", "replace", "strip", "startswith", "endswith", "split"}
_MAX_REPEAT = 100_000


class _Evaluator:
    def __init__(self, path: str, builtins: dict[str, Builtin]):
        self.path = path
        self.builtins = builtins
        self.variables: dict[str, Any] = {}

    def loc(self, node: ast.AST) -> Location:
        return Location(self.path, getattr(node, "lineno", 0), getattr(node, "col_offset", -1) + 1)

    def fail(self, node: ast.AST, message: str) -> UserError:
        return UserError(message, self.loc(node))

    # statements -------------------------------------------------------------------------------
    def run(self, module: ast.Module) -> None:
        for stmt in module.body:
            if isinstance(stmt, ast.Expr):
                if isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str):
                    continue  # a docstring
                if not isinstance(stmt.value, ast.Call):
                    raise self.fail(stmt, "a statement must be a rule call or an assignment")
                self.expr(stmt.value)
            elif isinstance(stmt, ast.Assign):
                if len(stmt.targets) != 1 or not isinstance(stmt.targets[0], ast.Name):
                    raise self.fail(stmt, "only simple assignments 'NAME = value' are allowed")
                name = stmt.targets[0].id
                if name in self.builtins:
                    raise self.fail(stmt, f"cannot assign to built-in '{name}'")
                self.variables[name] = self.expr(stmt.value)
            elif isinstance(stmt, ast.Pass):
                continue
            else:
                kind = type(stmt).__name__.lower()
                raise self.fail(stmt, f"'{kind}' statements are not allowed in BUILD files")

    # expressions ------------------------------------------------------------------------------
    def expr(self, node: ast.expr) -> Any:
        method = getattr(self, f"_{type(node).__name__}", None)
        if method is None:
            raise self.fail(node, f"{type(node).__name__} expressions are not allowed in BUILD files")
        return method(node)

    def _Constant(self, node: ast.Constant) -> Any:
        if isinstance(node.value, (str, int, float, bool)) or node.value is None:
            return node.value
        raise self.fail(node, f"unsupported literal {node.value!r}")

    def _List(self, node: ast.List) -> list:
        return [self.expr(e) for e in node.elts]

    def _Tuple(self, node: ast.Tuple) -> tuple:
        return tuple(self.expr(e) for e in node.elts)

    def _Dict(self, node: ast.Dict) -> dict:
        out: dict = {}
        for k, v in zip(node.keys, node.values):
            if k is None:
                raise self.fail(v, "'**' unpacking is not allowed in BUILD files")
            key = self.expr(k)
            if not isinstance(key, (str, int)):
                raise self.fail(k, "dict keys must be strings or integers")
            if key in out:
                raise self.fail(k, f"duplicate key {key!r} in dict")
            out[key] = self.expr(v)
        return out

    def _Name(self, node: ast.Name) -> Any:
        if node.id in self.variables:
            return self.variables[node.id]
        if node.id in self.builtins:
            raise self.fail(node, f"'{node.id}' is a function; call it")
        raise self.fail(node, f"name '{node.id}' is not defined")

    def _UnaryOp(self, node: ast.UnaryOp) -> Any:
        value = self.expr(node.operand)
        if (
            isinstance(node.op, (ast.USub, ast.UAdd))
            and isinstance(value, (int, float))
            and not isinstance(value, bool)
        ):
            return -value if isinstance(node.op, ast.USub) else value
        if isinstance(node.op, ast.Not):
            return not value
        raise self.fail(node, "unsupported unary operator")

    def _BinOp(self, node: ast.BinOp) -> Any:
        left, right = self.expr(node.left), self.expr(node.right)
        op = node.op
        try:
            if (
                isinstance(op, ast.Add)
                and type(left) is type(right)
                and isinstance(left, (str, list, int, float))
            ):
                return left + right
            if isinstance(op, ast.Add) and _is_number(left) and _is_number(right):
                return left + right
            if isinstance(op, (ast.Sub, ast.Div)) and _is_number(left) and _is_number(right):
                return left - right if isinstance(op, ast.Sub) else left / right
            if isinstance(op, ast.Mult):
                if _is_number(left) and _is_number(right):
                    return left * right
                seq, count = (left, right) if isinstance(right, int) else (right, left)
                if isinstance(seq, (str, list)) and isinstance(count, int) and not isinstance(count, bool):
                    if count * max(len(seq), 1) > _MAX_REPEAT:
                        raise self.fail(node, "repetition too large")
                    return seq * count
            if isinstance(op, ast.Mod) and isinstance(left, str):
                return left % (tuple(right) if isinstance(right, list) else right)
        except UserError:
            raise
        except (TypeError, ValueError, KeyError, ZeroDivisionError) as exc:
            raise self.fail(node, f"cannot apply operator: {exc}") from None
        raise self.fail(
            node, f"unsupported operand types for {type(op).__name__}: {_tname(left)} and {_tname(right)}"
        )

    def _JoinedStr(self, node: ast.JoinedStr) -> str:
        parts = []
        for value in node.values:
            if isinstance(value, ast.Constant):
                parts.append(str(value.value))
            elif isinstance(value, ast.FormattedValue):
                if value.format_spec is not None or value.conversion != -1:
                    raise self.fail(value, "f-string conversions and format specs are not supported")
                parts.append(_to_str(self.expr(value.value)))
        return "".join(parts)

    def _Subscript(self, node: ast.Subscript) -> Any:
        container = self.expr(node.value)
        index = self.expr(node.slice)
        try:
            return container[index]
        except (KeyError, IndexError, TypeError) as exc:
            raise self.fail(node, f"bad index {index!r}: {exc}") from None

    def _Call(self, node: ast.Call) -> Any:
        if isinstance(node.func, ast.Attribute):
            return self._method_call(node, node.func)
        if not isinstance(node.func, ast.Name):
            raise self.fail(node, "only named functions can be called")
        name = node.func.id
        builtin = self.builtins.get(name)
        if builtin is None:
            if name in self.variables:
                raise self.fail(node, f"'{name}' is not a function")
            raise self.fail(node, f"unknown rule or function '{name}'")
        args = []
        for a in node.args:
            if isinstance(a, ast.Starred):
                raise self.fail(a, "'*' unpacking is not allowed in BUILD files")
            args.append(self.expr(a))
        kwargs: dict[str, Arg] = {}
        for kw in node.keywords:
            if kw.arg is None:
                raise self.fail(kw, "'**' unpacking is not allowed in BUILD files")
            if kw.arg in kwargs:
                raise self.fail(kw, f"attribute '{kw.arg}' given twice")
            kwargs[kw.arg] = Arg(self.expr(kw.value), self.loc(kw))
        return builtin(args, kwargs, self.loc(node))

    def _method_call(self, node: ast.Call, func: ast.Attribute) -> Any:
        target = self.expr(func.value)
        if not isinstance(target, str) or func.attr not in _STR_METHODS:
            raise self.fail(node, f"method '{func.attr}' is not available on {_tname(target)}")
        args = [self.expr(a) for a in node.args]
        kwargs = {kw.arg: self.expr(kw.value) for kw in node.keywords if kw.arg}
        try:
            return getattr(target, func.attr)(*args, **kwargs)
        except (TypeError, ValueError, KeyError, IndexError) as exc:
            raise self.fail(node, f"{func.attr}() failed: {exc}") from None


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _tname(value: Any) -> str:
    return {str: "string", list: "list", dict: "dict", tuple: "tuple", bool: "bool"}.get(
        type(value), type(value).__name__
    )


def _to_str(value: Any) -> str:
    return value if isinstance(value, str) else repr(value)


def evaluate(source: str, path: str, builtins: dict[str, Builtin]) -> dict[str, Any]:
    """Evaluate one BUILD file; rule builtins record targets as a side effect. Returns its variables."""
    try:
        module = ast.parse(source, filename=path)
    except SyntaxError as exc:
        raise UserError(
            f"syntax error: {exc.msg}", Location(path, exc.lineno or 0, exc.offset or 0)
        ) from None
    except ValueError as exc:  # e.g. null bytes
        raise UserError(f"cannot parse: {exc}", Location(path)) from None
    evaluator = _Evaluator(path, builtins)
    evaluator.run(module)
    return evaluator.variables
