"""The precision search counts the hand-overs and NPU parts a table's float layers add as the
partition orders the ops: adjacent float layers are one CPU part, one pair of hand-overs."""

from __future__ import annotations

import pytest
from onnx import helper

from npubuild.stages.quantize.graphinfo import node_label
from npubuild.stages.quantize.search.prices import device_parts


def _chain(length: int):
    """A chain of Relu ops whose end an Add joins with the first op's result."""
    nodes = [helper.make_node("Relu", [f"t{i}"], [f"t{i + 1}"], name=f"r{i}") for i in range(length)]
    nodes.append(helper.make_node("Add", [f"t{length}", "t1"], ["y"], name="join"))
    return helper.make_graph(nodes, "chain", [], [])


def _branches():
    """Two branches from one op, each ending in a layer the table keeps float (`f1` right after the
    fork, `f2` after an NPU op), joined: in node order the devices alternate four times."""
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="fork"),
        helper.make_node("Relu", ["a"], ["b"], name="f1"),
        helper.make_node("Relu", ["a"], ["c"], name="n2"),
        helper.make_node("Relu", ["c"], ["d"], name="f2"),
        helper.make_node("Add", ["b", "d"], ["y"], name="join"),
    ]
    return helper.make_graph(nodes, "branches", [], [])


@pytest.mark.parametrize(
    ("on_cpu", "hand_overs", "npu_parts"),
    [
        (set(), 0, 1),
        ({"r2"}, 2, 2),
        ({"r2", "r3"}, 2, 2),  # adjacent: one CPU part
        ({"r2", "r4"}, 4, 3),
        ({"r0"}, 1, 1),  # at the start: the NPU part follows it
        ({"join"}, 1, 1),
    ],
)
def test_float_layers_cut_the_program_as_the_partition_does(on_cpu, hand_overs, npu_parts):
    graph = _chain(6)
    labels = {node_label(n): n.name for n in graph.node}
    got = device_parts(graph, lambda label: labels[label] not in on_cpu)
    assert got == (hand_overs, npu_parts)


def test_float_layers_apart_in_node_order_share_a_cpu_part_when_the_partition_can():
    """The partition stays on the NPU while an NPU op is ready (n2 runs before f1), so f1 and f2
    are one CPU part: 2 hand-overs, not the 4 that node order would give."""
    graph = _branches()
    labels = {node_label(n): n.name for n in graph.node}
    assert device_parts(graph, lambda label: labels[label] not in {"f1", "f2"}) == (2, 2)
