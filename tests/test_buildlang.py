"""The BUILD evaluator: what it accepts, what it computes, and that it refuses everything else."""

import pytest

from npubuild.buildlang import evaluate
from npubuild.errors import UserError


def record_calls():
    calls = []

    def rule(args, kwargs, location):
        calls.append(({k: a.value for k, a in kwargs.items()}, location))

    return calls, {"rule": rule}


def test_literals_variables_and_operators():
    calls, builtins = record_calls()
    variables = evaluate(
        'A = [1, 2]\nB = A + [3]\nS = "x" + "y"\nF = "%s-%d" % ("a", 4)\n'
        'G = "{}/{}".format("p", "q")\nH = f"v{S}"\nD = {"k": -1.5, "n": None}\nT = (True, False)\n'
        'J = ",".join(["a", "b"])\nK = D["k"] * 2\nrule(name = "n", v = B, s = S)\n',
        "BUILD",
        builtins,
    )
    assert variables["B"] == [1, 2, 3]
    assert variables["F"] == "a-4"
    assert variables["G"] == "p/q"
    assert variables["H"] == "vxy"
    assert variables["J"] == "a,b"
    assert variables["K"] == -3.0
    assert calls[0][0] == {"name": "n", "v": [1, 2, 3], "s": "xy"}
    assert (calls[0][1].line, calls[0][1].col) == (11, 1)


def test_comments_and_formatting_do_not_matter():
    a_calls, a = record_calls()
    b_calls, b = record_calls()
    evaluate('rule(name="x", v=[1,2])', "BUILD", a)
    evaluate(
        '# comment\n\nrule(\n    name = "x",  # why\n    v = [\n        1,\n        2,\n    ],\n)\n',
        "BUILD",
        b,
    )
    assert a_calls[0][0] == b_calls[0][0]


@pytest.mark.parametrize(
    "source, message, line",
    [
        ("import os", "'import' statements are not allowed", 1),
        ("x = 1\ndef f():\n    pass", "'functiondef' statements are not allowed", 2),
        ("x = __import__('os')", "unknown rule or function '__import__'", 1),
        ("x = (1).real", "Attribute expressions are not allowed", 1),
        ("x = [i for i in [1]]", "ListComp expressions are not allowed", 1),
        ("x = lambda: 1", "Lambda expressions are not allowed", 1),
        ("y = x", "name 'x' is not defined", 1),
        ("rule(name = 'a', name = 'b')", "", 1),
        ('"a" * 10000000', "a statement must be a rule call", 1),
        ('x = "a" * 10000000', "repetition too large", 1),
        ("x = 1 +", "syntax error", 1),
        ("x = {'a': 1, 'a': 2}", "duplicate key", 1),
        ("x = 'abc'.__class__", "Attribute expressions are not allowed", 1),
        ("x = 'a'.zfill(3)", "method 'zfill' is not available", 1),
        ("x = 1\n\nrule(**{'name': 'a'})", "'**' unpacking is not allowed", 3),
        ("for i in []:\n    pass", "'for' statements are not allowed", 1),
    ],
)
def test_refused_constructs_name_their_line(source, message, line):
    _, builtins = record_calls()
    with pytest.raises(UserError) as info:
        evaluate(source, "pkg/BUILD", builtins)
    assert message in info.value.message
    assert info.value.location.path == "pkg/BUILD"
    assert info.value.location.line == line
    assert str(info.value).startswith(f"pkg/BUILD:{line}")
