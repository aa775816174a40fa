"""The precision probe's switches as If branches: the same values as the Where form for every
switch setting, the switched Q/DQ pair inside its branch, a pair something else reads left where it
was, and a graph with subgraphs of its own left as it is."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

from npubuild.stages.quantize.probe import _switches_as_branches


def _graph(shared_dq: bool) -> onnx.ModelProto:
    """x -> Q/DQ -> Where(on, dq, x) -> Relu -> y; with shared_dq the DQ also feeds an output."""
    inits = [
        helper.make_tensor("s", TensorProto.FLOAT, [], [0.05]),
        helper.make_tensor("z", TensorProto.INT8, [], [3]),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
        helper.make_node("DequantizeLinear", ["q", "s", "z"], ["dq"]),
        helper.make_node("Where", ["on", "dq", "x"], ["sel"]),
        helper.make_node("Relu", ["sel"], ["y"]),
    ]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    if shared_dq:
        outputs.append(helper.make_tensor_value_info("dq", TensorProto.FLOAT, None))
    graph = helper.make_graph(
        nodes,
        "g",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 50]),
            helper.make_tensor_value_info("on", TensorProto.BOOL, []),
        ],
        outputs,
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def _run(model: onnx.ModelProto, feed: dict) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feed)


def test_branches_give_the_where_forms_values_and_take_their_qdq_along():
    x = np.random.default_rng(2).normal(0, 2, (2, 50)).astype(np.float32)
    for shared in (False, True):
        where_form = _graph(shared)
        branched = _graph(shared)
        _switches_as_branches(branched.graph, {"on"})
        main_ops = [n.op_type for n in branched.graph.node]
        assert "Where" not in main_ops and "If" in main_ops
        # a DQ something else reads stays in the main graph; an exclusive pair moves in
        assert ("DequantizeLinear" in main_ops) == shared
        for on in (True, False):
            feed = {"x": x, "on": np.array(on)}
            want, got = _run(where_form, feed), _run(branched, feed)
            for w, g in zip(want, got):
                np.testing.assert_array_equal(g, w)
        quantized = _run(branched, {"x": x, "on": np.array(True)})[0]
        assert not np.array_equal(quantized, np.maximum(x, 0))  # the switch does something


def test_a_graph_with_subgraphs_keeps_its_where():
    model = _graph(False)
    body = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["b"])],
        "b",
        [],
        [helper.make_tensor_value_info("b", TensorProto.FLOAT, None)],
    )
    model.graph.node.append(helper.make_node("If", ["on"], ["extra"], then_branch=body, else_branch=body))
    before = [n.op_type for n in model.graph.node]
    _switches_as_branches(model.graph, {"on"})
    assert [n.op_type for n in model.graph.node] == before
