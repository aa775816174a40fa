"""A safe evaluator for BUILD files: a Starlark subset walked from Python's AST, never exec/eval.

Supported: rule calls with keyword arguments, literals, lists, tuples, dicts, variables, `+`
(strings and lists), `*` (string/list repetition, numbers), `%` and `.format()` string formatting,
f-strings, `.join()`, indexing with a constant, unary minus, and the built-ins the rule set provides
(`glob`, `pypi_file`, ...). Everything else is an error at its file:line:col.

A BUILD file is untrusted input, so evaluation is a sandbox with budgets: formatting is our own
(fields name an argument, never an attribute or an item of one, and widths are small), integers
stay within 64 bits, every string and list within `MAX_LENGTH`, all of them together within
`MAX_ALLOCATED`, expressions within `MAX_DEPTH` levels, and a file within `MAX_STEPS` evaluation
steps and `MAX_SECONDS`. Each limit is checked before the value is made, so memory stays bounded,
and each breach is one error at its file:line:col.
"""

from __future__ import annotations

import ast
import re
import string
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from npubuild.errors import Location, UserError

MAX_SOURCE_BYTES = 1 << 20
MAX_DEPTH = 100  # nesting of expressions; Python's own parser stops at 200 parentheses
MAX_STEPS = 1_000_000
MAX_SECONDS = 5.0
MAX_INT = (1 << 63) - 1
MAX_LENGTH = 1_000_000  # characters of a string, elements of a list
MAX_ALLOCATED = 20_000_000  # characters and elements made by one file, all values together
MAX_WIDTH = 1000  # of a formatted field


@dataclass(frozen=True)
class Arg:
    """A keyword argument's value with where it was written, so validation errors can point at it."""

    value: Any
    location: Location


# A builtin receives (positional values, keyword Args, location of the call) and returns a value.
Builtin = Callable[[list[Any], dict[str, Arg], Location], Any]

_STR_METHODS = {"format", "join", "upper", "lower", "replace", "strip", "startswith", "endswith", "split"}
_FORMAT_SPEC = re.compile(r"^(?:.?[<>^=])?[-+ ]?0?(?P<width>\d*)(?:\.(?P<precision>\d+))?[bdeEfFgGosxX%]?$")
_PERCENT_SPEC = re.compile(
    r"%(?:\((?P<key>\w*)\))?[-+ #0]*(?P<width>\*|\d+)?(?:\.(?P<precision>\*|\d+))?(?P<kind>.?)"
)


class _Evaluator:
    def __init__(self, path: str, builtins: dict[str, Builtin]):
        self.path = path
        self.builtins = builtins
        self.variables: dict[str, Any] = {}
        self.steps = 0
        self.allocated = 0
        self.deadline = time.monotonic() + MAX_SECONDS

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

    # budgets ----------------------------------------------------------------------------------
    def step(self, node: ast.AST) -> None:
        self.steps += 1
        if self.steps > MAX_STEPS:
            raise self.fail(node, f"evaluation takes more than {MAX_STEPS:,} steps")
        if self.steps % 1024 == 0 and time.monotonic() > self.deadline:
            raise self.fail(node, f"evaluation takes more than {MAX_SECONDS:g} seconds")

    def make(self, node: ast.AST, length: int, what: str = "value too large") -> None:
        """Account for a string or list of `length` about to be made; refuse it over budget."""
        if length > MAX_LENGTH:
            raise self.fail(node, f"{what}: {length:,} characters or elements (at most {MAX_LENGTH:,})")
        self.allocated += length
        if self.allocated > MAX_ALLOCATED:
            raise self.fail(node, f"the file makes more than {MAX_ALLOCATED:,} characters and elements")

    def number(self, node: ast.AST, value: Any) -> Any:
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_INT:
            raise self.fail(node, "integer overflow (BUILD integers are 64-bit)")
        return value

    # expressions ------------------------------------------------------------------------------
    def expr(self, node: ast.expr) -> Any:
        self.step(node)
        method = getattr(self, f"_{type(node).__name__}", None)
        if method is None:
            raise self.fail(node, f"{type(node).__name__} expressions are not allowed in BUILD files")
        return method(node)

    def _Constant(self, node: ast.Constant) -> Any:
        if isinstance(node.value, (str, int, float, bool)) or node.value is None:
            return self.number(node, node.value)
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
            if isinstance(op, ast.Add) and type(left) is type(right) and isinstance(left, (str, list)):
                self.make(node, len(left) + len(right))
                return left + right
            if isinstance(op, ast.Add) and _is_number(left) and _is_number(right):
                return self.number(node, left + right)
            if isinstance(op, (ast.Sub, ast.Div)) and _is_number(left) and _is_number(right):
                return self.number(node, left - right if isinstance(op, ast.Sub) else left / right)
            if isinstance(op, ast.Mult):
                if _is_number(left) and _is_number(right):
                    if isinstance(left, int) and isinstance(right, int):
                        if left.bit_length() + right.bit_length() > 64:
                            raise self.fail(node, "integer overflow (BUILD integers are 64-bit)")
                    return self.number(node, left * right)
                seq, count = (left, right) if isinstance(right, int) else (right, left)
                if isinstance(seq, (str, list)) and isinstance(count, int) and not isinstance(count, bool):
                    self.make(node, max(count, 0) * len(seq), "repetition too large")
                    return seq * count
            if isinstance(op, ast.Mod) and isinstance(left, str):
                return self.percent(node, left, right)
        except UserError:
            raise
        except (TypeError, ValueError, KeyError, ZeroDivisionError, OverflowError) as exc:
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
        self.make(node, sum(len(p) for p in parts))
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
        if any(kw.arg is None for kw in node.keywords):
            raise self.fail(node, "'**' unpacking is not allowed in BUILD files")
        try:
            if func.attr == "format":
                return self.format(node, target, args, kwargs)
            if func.attr == "join":
                (items,) = args
                if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
                    raise TypeError("join() takes a list of strings")
                self.make(node, sum(len(i) for i in items) + len(target) * max(len(items) - 1, 0))
            elif func.attr == "replace":
                old, new = args[0], args[1]
                if not isinstance(old, str) or not isinstance(new, str):
                    raise TypeError("replace() takes two strings")
                self.make(node, len(target) + (target.count(old) + 1) * max(len(new) - len(old), 0))
            elif func.attr == "split":
                self.make(node, len(target) + 1)
            else:
                self.make(node, len(target) * 3)  # upper() of some characters is three of them
            return getattr(target, func.attr)(*args, **kwargs)
        except UserError:
            raise
        except (TypeError, ValueError, KeyError, IndexError) as exc:
            raise self.fail(node, f"{func.attr}() failed: {exc}") from None

    # formatting: our own, so a format string can reach nothing but the values it is given -------
    def format(self, node: ast.AST, template: str, args: list, kwargs: dict) -> str:
        parts: list[str] = []
        auto = 0
        for literal, field, spec, conversion in string.Formatter().parse(template):
            parts.append(literal)
            if field is None:
                continue
            if field == "":
                key: int | str = auto
                auto += 1
            elif field.isdigit():
                key = int(field)
            elif field.isidentifier():
                key = field
            else:
                raise self.fail(node, f"format field '{{{field}}}' must be empty, a number or a name")
            try:
                value = args[key] if isinstance(key, int) else kwargs[key]
            except (IndexError, KeyError):
                raise self.fail(node, f"format() has no argument for '{{{field}}}'") from None
            if conversion == "r":
                value = repr(value) if isinstance(value, str) else _to_str(value)
            elif conversion not in (None, "s"):
                raise self.fail(node, f"format conversion '!{conversion}' is not supported")
            parts.append(self.field(node, value, spec or ""))
            self.make(node, sum(len(p) for p in parts))
        return "".join(parts)

    def field(self, node: ast.AST, value: Any, spec: str) -> str:
        """One formatted value: a plain string, number or bool, with a small width and precision."""
        if not spec:
            return _to_str(value)
        found = _FORMAT_SPEC.match(spec)
        if found is None or not isinstance(value, (str, int, float)):
            raise self.fail(node, f"format spec ':{spec}' is not supported for {_tname(value)}")
        for part in ("width", "precision"):
            if len(found[part] or "") > 4 or int(found[part] or 0) > MAX_WIDTH:
                raise self.fail(node, f"format {part} {found[part]} is larger than {MAX_WIDTH}")
        try:
            return format(value, spec)
        except (TypeError, ValueError) as exc:
            raise self.fail(node, f"format spec ':{spec}': {exc}") from None

    def percent(self, node: ast.AST, template: str, values: Any) -> str:
        """printf-style `%` formatting with bounded widths and precisions, and no `*`."""
        for found in _PERCENT_SPEC.finditer(template):
            for part in ("width", "precision"):
                text = found[part]
                if text == "*":
                    raise self.fail(node, "'*' widths are not supported in % formatting")
                if text and (len(text) > 4 or int(text) > MAX_WIDTH):
                    raise self.fail(node, f"% format width {text} is larger than {MAX_WIDTH}")
        if isinstance(values, list):
            values = tuple(values)
        elif not isinstance(values, (tuple, dict)):
            values = (values,)
        if isinstance(values, tuple):
            values = tuple(v if isinstance(v, (str, int, float)) else _to_str(v) for v in values)
        try:
            result = template % values
        except (TypeError, ValueError, KeyError) as exc:
            raise self.fail(node, f"% formatting failed: {exc}") from None
        self.make(node, len(result))
        return result


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _tname(value: Any) -> str:
    return {str: "string", list: "list", dict: "dict", tuple: "tuple", bool: "bool"}.get(
        type(value), type(value).__name__
    )


def _to_str(value: Any) -> str:
    return value if isinstance(value, str) else repr(value)


def _longest_line(source: str) -> int:
    """Where the statement with the most tokens starts: the one Python's parser choked on."""
    import io
    import tokenize

    best, best_count, start, count = 0, -1, 1, 0
    try:
        for token in tokenize.generate_tokens(io.StringIO(source).readline):
            if count == 0:
                start = token.start[0]
            count += 1
            if token.type in (tokenize.NEWLINE, tokenize.ENDMARKER):
                if count > best_count:
                    best, best_count = start, count
                count = 0
    except (tokenize.TokenError, SyntaxError):
        pass
    return best


def _check_depth(module: ast.Module, path: str) -> None:
    """Refuse expressions nested deeper than MAX_DEPTH before evaluating (which recurses)."""
    todo: list[tuple[ast.AST, int, Location]] = [(module, 0, Location(path))]
    while todo:
        node, depth, where = todo.pop()
        if hasattr(node, "lineno"):
            where = Location(path, node.lineno, node.col_offset + 1)
        if depth > MAX_DEPTH:
            raise UserError(f"expression nested more than {MAX_DEPTH} levels deep", where)
        todo.extend((child, depth + 1, where) for child in ast.iter_child_nodes(node))


def evaluate(source: str, path: str, builtins: dict[str, Builtin]) -> dict[str, Any]:
    """Evaluate one BUILD file; rule builtins record targets as a side effect. Returns its variables."""
    if len(source) > MAX_SOURCE_BYTES:
        raise UserError(f"BUILD file larger than {MAX_SOURCE_BYTES:,} characters", Location(path))
    try:
        with warnings.catch_warnings():  # SyntaxWarnings would print to stderr: errors are ours
            warnings.simplefilter("ignore")
            module = ast.parse(source, filename=path)
    except SyntaxError as exc:
        raise UserError(
            f"syntax error: {exc.msg}", Location(path, exc.lineno or 0, exc.offset or 0)
        ) from None
    except ValueError as exc:  # e.g. null bytes
        raise UserError(f"cannot parse: {exc}", Location(path)) from None
    except (RecursionError, MemoryError):
        where = Location(path, _longest_line(source))
        raise UserError(
            f"expression nested too deeply to parse (at most {MAX_DEPTH} levels)", where
        ) from None
    _check_depth(module, path)
    evaluator = _Evaluator(path, builtins)
    evaluator.run(module)
    return evaluator.variables
