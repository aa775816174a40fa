"""The planner keys its per-node choices by node identity: it must hold one object per node, since
python-protobuf makes a fresh wrapper per access for a node nobody holds and hands a freed one's id
to the next. A graph of input-less nodes (no consumer list holds them) used to crash the plan
(KeyError) or could give one node another's cached reason."""

from __future__ import annotations

import onnx
from onnx import TensorProto, helper

from npubuild.rules.attrs import QuantizeConfig
from npubuild.stages.quantize.planning import Planner


def _model():
    nodes = []
    for k in range(4):
        nodes.append(helper.make_node("RandomUniform", [], [f"r{k}"], shape=[1, 4], name=f"rand{k}"))
        value = helper.make_tensor("v", TensorProto.FLOAT, [1, 4], [1, 2, 3, 4])
        nodes.append(helper.make_node("Constant", [], [f"c{k}"], name=f"const{k}", value=value))
    nodes += [helper.make_node("Add", [f"r{k}", f"c{k}"], [f"y{k}"], name=f"add{k}") for k in range(4)]
    outputs = [helper.make_tensor_value_info(f"y{k}", TensorProto.FLOAT, [1, 4]) for k in range(4)]
    graph = helper.make_graph(nodes, "inputless", [], outputs)
    return onnx.shape_inference.infer_shapes(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    )


def test_every_inputless_node_keeps_its_own_choice_across_plans():
    model, cache = _model(), {}
    settings = QuantizeConfig().model_dump()
    for _ in range(3):  # plans sharing one cache, as the precision search's do
        plan = Planner(model, {}, {}, settings, cache).build()
        reasons = {f["node"]: f["reason"] for f in plan.float_nodes}
        for k in range(4):
            assert reasons[f"rand{k}"] == "no integer rule for RandomUniform"
            assert reasons[f"const{k}"] == "no integer rule for Constant"
