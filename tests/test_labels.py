import pytest

from npubuild.errors import UserError
from npubuild.labels import Label, parse_label, parse_pattern


@pytest.mark.parametrize(
    "text, package, expected",
    [
        ("//models:yolo", None, Label("models", "yolo")),
        ("//models", None, Label("models", "models")),
        ("//a/b/c:x-1.v2", None, Label("a/b/c", "x-1.v2")),
        (":yolo", "models", Label("models", "yolo")),
        ("yolo", "models", Label("models", "yolo")),
        ("//:root", None, Label("", "root")),
    ],
)
def test_parse_label(text, package, expected):
    assert parse_label(text, package) == expected


@pytest.mark.parametrize(
    "text", ["", "models:yolo", "//models:", "//../x:y", "//a//b:c", ":x", "//a:b:c", "//:"]
)
def test_bad_labels_are_user_errors(text):
    with pytest.raises(UserError, match="bad label"):
        parse_label(text)


def test_label_string_round_trip():
    assert str(parse_label("//a/b:c")) == "//a/b:c"
    assert parse_label(str(Label("x", "y"))) == Label("x", "y")


@pytest.mark.parametrize(
    "pattern, hits, misses",
    [
        ("//...", ["//a:x", "//a/b:y", "//:z"], []),
        ("//a/...", ["//a:x", "//a/b:y"], ["//ab:x", "//:z"]),
        ("//a:all", ["//a:x", "//a:y"], ["//a/b:y"]),
        ("//a:x", ["//a:x"], ["//a:y"]),
        ("//a", ["//a:a"], ["//a:x"]),
    ],
)
def test_patterns(pattern, hits, misses):
    p = parse_pattern(pattern)
    assert all(p.matches(parse_label(h)) for h in hits)
    assert not any(p.matches(parse_label(m)) for m in misses)


@pytest.mark.parametrize("text", ["models", ":x", "//a:", "//a/../b:c", "//a:b:c"])
def test_bad_patterns(text):
    with pytest.raises(UserError):
        parse_pattern(text)
