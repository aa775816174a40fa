"""Early reductions (targets/backend/reorder.py): a feature pyramid's lateral 1x1 convolution,
the last reader of a backbone level and a quarter of its bytes, runs right after the level is
made, so the level no longer lives across the backbone; a reader that does not reduce stays. The
code generator compiles the grouping choices in both orders and keeps the better: here the
reordered binary, which computes the integer model's codes, hazard-free, with fewer DRAM bytes."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper
from stripe_kit import SMALL, assert_computes_the_codes, build_int8

import npubuild.targets.compile as compile_module
from conftest import small_model
from npubuild.targets.backend.memory import tensor_bytes
from npubuild.targets.backend.reorder import early_reductions
from npubuild.targets.compile import compile_npub, model_shapes
from npubuild.targets.hazards import binary_hazards

SIZE = 128  # the level, 256 KiB, cannot stay on SMALL's chip across the backbone


def _pyramid(rng: np.random.Generator, lateral_channels: int) -> onnx.ModelProto:
    """A backbone level (16 x 96 x 96) read by the next backbone layer at once and by a lateral
    1x1 convolution after three more layers, whose result joins the deepest level upsampled 4x."""
    c = lateral_channels
    weights = {
        "w0": rng.normal(size=(16, 3, 3, 3)) * 0.4,
        "w1": rng.normal(size=(32, 16, 3, 3)) * 0.1,
        "w2": rng.normal(size=(32, 32, 3, 3)) * 0.06,
        "w3": rng.normal(size=(32, 32, 3, 3)) * 0.06,
        "wd": rng.normal(size=(c, 32, 1, 1)) * 0.2,
        "wl": rng.normal(size=(c, 16, 1, 1)) * 0.3,
        "scales": np.array([1.0, 1.0, 4.0, 4.0]),
    }
    nodes = [
        helper.make_node("Conv", ["x", "w0"], ["level"], pads=[1, 1, 1, 1], name="stem"),
        helper.make_node("Conv", ["level", "w1"], ["b1"], pads=[1, 1, 1, 1], strides=[2, 2], name="down1"),
        helper.make_node("Relu", ["b1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2"], ["b2"], pads=[1, 1, 1, 1], name="mid"),
        helper.make_node("Relu", ["b2"], ["r2"], name="relu2"),
        helper.make_node("Conv", ["r2", "w3"], ["b3"], pads=[1, 1, 1, 1], strides=[2, 2], name="down2"),
        helper.make_node("Conv", ["b3", "wd"], ["deep"], name="reduce_deep"),
        helper.make_node("Resize", ["deep", "", "scales"], ["up"], mode="nearest", name="upsample"),
        helper.make_node("Conv", ["level", "wl"], ["lat"], name="lateral"),
        helper.make_node("Add", ["lat", "up"], ["y"], name="join"),
    ]
    return small_model(nodes, "pyramid", {"x": [1, 3, SIZE, SIZE]}, {"y": [1, c, SIZE, SIZE]}, weights, 13)


@pytest.fixture(scope="module", params=[4, 16])
def built(request, tmp_path_factory):
    rng = np.random.default_rng(3)
    model = _pyramid(rng, request.param)
    samples = rng.normal(size=(6, 3, SIZE, SIZE)).astype(np.float32)
    return request.param, build_int8(model, tmp_path_factory.mktemp("pyramid"), samples)


def _order(program) -> list[str]:
    return [op.node for op in program.ops]


def test_a_lateral_that_reduces_its_level_runs_right_after_it(built):
    channels, (model, program, arrays, _, plan) = built
    shapes = model_shapes(model)
    moved, renumbered = early_reductions(program, plan, lambda n: tensor_bytes(n, program.tensors, shapes))
    before, after = _order(program), _order(moved)
    assert sorted(after) == sorted(before)
    if channels == 4:  # a quarter of the level's bytes: it moves to right after the stem
        assert after.index("lateral") == after.index("stem") + 1
        assert before.index("lateral") > before.index("down2")
        # every op still comes after the ops that make its inputs
        made = set(moved.inputs) | {n for op in moved.ops for n in op.constants}
        for op in moved.ops:
            assert all(n in made or n in arrays for n in op.inputs if n), op.node
            made.update(op.outputs)
        assert [sg["ops"] for sg in renumbered["subgraphs"]] == [sg["ops"] for sg in plan["subgraphs"]]
    else:  # as many channels as the level: nothing to gain by holding its result instead
        assert after == before and moved is program


def test_the_code_generator_compiles_both_orders_and_keeps_the_better(built, monkeypatch):
    # at the grid's resident budgets: past them (compile.MAX_RESIDENT_SHARE) the model's level
    # stays resident in either order, and that choice is the fastest of both
    monkeypatch.setattr(compile_module, "MAX_RESIDENT_SHARE", max(compile_module.RESIDENT_SHARES))
    channels, b = built
    data, _, stats = compile_npub(b.program, b.arrays, b.model, SMALL, b.plan)
    assert binary_hazards(data) == []
    assert_computes_the_codes(data, b)
    reordered = [t for t in stats["grouping_search"] if t.get("early_reductions")]
    in_order = [t for t in stats["grouping_search"] if not t.get("early_reductions")]
    monkeypatch.setattr(compile_module, "early_reductions", lambda program, plan, nbytes: (program, plan))
    _, _, without = compile_npub(b.program, b.arrays, b.model, SMALL, b.plan)
    if channels == 4:
        assert reordered and in_order
        assert min(t["dram_bytes"] for t in reordered) < min(t["dram_bytes"] for t in in_order)
        assert stats["dram_bytes"] < without["dram_bytes"]
        assert stats["estimated_cycles"] <= without["estimated_cycles"] * 1.01  # DRAM_TIE
    else:
        assert not reordered
        assert (stats["estimated_cycles"], stats["dram_bytes"]) == (
            without["estimated_cycles"],
            without["dram_bytes"],
        )
