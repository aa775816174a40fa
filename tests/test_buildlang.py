"""The BUILD evaluator (Starlark): what it computes, where each call was written, and that it
refuses what Starlark refuses, each at its line."""

from pathlib import Path

import pytest

from npubuild.buildlang import evaluate
from npubuild.errors import UserError


def record_calls():
    calls = []

    def rule(args, kwargs, location):
        calls.append(
            ({k: a.value for k, a in kwargs.items()}, location, {k: a.location for k, a in kwargs.items()})
        )

    return calls, {"rule": rule}


def run(tmp_path: Path, source: str, builtins) -> list[str]:
    return evaluate(source, "pkg/BUILD", builtins, tmp_path, tmp_path / "pkg")


def test_values_operators_and_locations(tmp_path):
    calls, builtins = record_calls()
    run(
        tmp_path,
        'A = [1, 2]\nB = A + [3]\nS = "x" + "y"\nF = "%s-%d" % ("a", 4)\n'
        'G = "{}/{}".format("p", "q")\nD = {"k": -1.5, "n": None}\nT = (True, False)\n'
        'J = ",".join(["a", "b"])\nK = D["k"] * 2\nrule(name = "n", v = B, s = S,\n'
        "     f = F, g = G, j = J, k = K, t = T, d = D, q = 1 / 4)\n",
        builtins,
    )
    (values, where, at) = calls[0]
    assert values == {
        "name": "n",
        "v": [1, 2, 3],
        "s": "xy",
        "f": "a-4",
        "g": "p/q",
        "j": "a,b",
        "k": -3.0,
        "t": [True, False],
        "d": {"k": -1.5, "n": None},
        "q": 0.25,
    }
    assert (where.line, where.col) == (10, 1)
    assert (at["s"].line, at["s"].col) == (10, 29) and at["k"].line == 11


def test_comments_and_formatting_do_not_matter(tmp_path):
    a_calls, a = record_calls()
    b_calls, b = record_calls()
    run(tmp_path, 'rule(name="x", v=[1,2])', a)
    run(
        tmp_path,
        '# comment\n\nrule(\n    name = "x",  # why\n    v = [\n        1,\n        2,\n    ],\n)\n',
        b,
    )
    assert a_calls[0][0] == b_calls[0][0]


def test_macros_loops_and_comprehensions_make_rules(tmp_path):
    calls, builtins = record_calls()
    run(
        tmp_path,
        "def pair(name, n):\n    for i in range(n):\n        rule(name = name + str(i))\n"
        'pair("a", 2)\n[rule(name = "c%d" % i) for i in [7, 8] if i > 7]\n',
        builtins,
    )
    assert [c[0]["name"] for c in calls] == ["a0", "a1", "c8"]
    assert [c[1].line for c in calls] == [4, 4, 5]  # a macro's rules point at the macro's call


@pytest.mark.parametrize(
    "source, message, line",
    [
        ("import os", "syntax error", 1),
        ("x = __import__('os')", "unknown rule or function '__import__'", 1),
        ("x = (1).real", "real", 1),
        ("y = x", "unknown name 'x'", 1),
        ("rule(name = 'a', name = 'b')", "", 1),
        ("x = 1 +", "syntax error", 1),
        ("x = 'abc'.__class__", "__class__", 1),
        ("x = 'a'.zfill(3)", "zfill", 1),
        ("x = 1\n\nrule(name = 1 // 0)", "division by zero", 3),
        ("while True:\n    pass", "syntax error", 1),
        ('x = f"{1}"', "f-strings", 1),
    ],
)
def test_refused_constructs_name_their_line(tmp_path, source, message, line):
    _, builtins = record_calls()
    with pytest.raises(UserError) as info:
        run(tmp_path, source, builtins)
    assert message in info.value.message, info.value.message
    assert info.value.location.path == "pkg/BUILD"
    assert info.value.location.line == line
    assert str(info.value).startswith(f"pkg/BUILD:{line}")


def test_a_file_with_many_targets_comes_back_whole(tmp_path):
    """The child hands its record back in 64 KiB pieces: a large one must arrive exactly once."""
    calls, builtins = record_calls()
    run(tmp_path, '[rule(name = "t%d" % i, v = "x" * 200) for i in range(3000)]\n', builtins)
    assert [c[0]["name"] for c in calls] == [f"t{i}" for i in range(3000)]
    assert all(c[0]["v"] == "x" * 200 for c in calls)
