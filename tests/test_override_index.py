"""The planner's override lookup finds exactly the overrides the plain rule matches (a glob or an
exact name on the layer's label, or its op type), in their order."""

from __future__ import annotations

import fnmatch
import itertools

from npubuild.stages.quantize.planning import _OverrideIndex


def _plain(overrides: list[dict], label: str, op_type: str) -> list[int]:
    return [
        i
        for i, o in enumerate(overrides)
        if (o.get("match") and fnmatch.fnmatchcase(label, o["match"])) or o.get("op_type") == op_type
    ]


def test_lookup_matches_the_plain_rule_in_order():
    overrides = [
        {"match": "conv.1", "bits": 16},
        {"match": "conv.*"},
        {"op_type": "Conv", "bits": 8},
        {"match": "conv.1", "op_type": "Add"},
        {"match": "conv.[12]", "keep_float": True},
        {"match": "add?"},
        {"match": "conv.1"},  # the same name twice: both, in order
        {"match": None, "op_type": None},
    ]
    index = _OverrideIndex(overrides)
    labels = ["conv.1", "conv.2", "conv.10", "add1", "add", "Conv.1", "conv.*"]
    checked = 0
    for label, op_type in itertools.product(labels, ["Conv", "Add", "Relu"]):
        assert index.matching(label, op_type) == _plain(overrides, label, op_type), (label, op_type)
        checked += bool(_plain(overrides, label, op_type))
    assert checked > 10
    assert index.matching("conv.1", "Add") == [0, 1, 3, 4, 6]
