"""Stripes through branches that join again (targets/backend/stripes.py, `_Regions`): a local
response normalisation (x times a table of the 1x1 window sum of x squared) and a squeeze-excite
tail (x + x * gate, the gate one row) run in stripes as one region each; a residual block whose
branch needs halo rows (a 3x3 convolution) does not. The striped binary still computes the
integer model's codes, and moves fewer DRAM bytes than the chains alone."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper
from stripe_kit import SMALL, assert_computes_the_codes, build_int8, striping_of

from conftest import small_model
from npubuild.targets.compile import (
    RESIDENT_SHARES,
    Grouping,
    _compile,
    compile_npub,
    model_shapes,
    stripings,
)
from npubuild.targets.hazards import binary_hazards

SIZE = 96
BUDGET = 64 * 1024
OUTPUTS = ("y1", "y2", "y3")


def _model(rng: np.random.Generator) -> onnx.ModelProto:
    """Three blocks on 96 x 96 maps, each from its own convolution of the input: the
    normalisation's diamond, the squeeze-excite tail, and a residual block with a 3x3 branch."""
    weights = {
        "w0": rng.normal(size=(16, 3, 3, 3)) * 0.4,
        "win": np.abs(rng.normal(size=(16, 16, 1, 1))) * 0.1,  # the window sum over channels
        "w1": rng.normal(size=(16, 3, 3, 3)) * 0.4,
        "wse": rng.normal(size=(16, 16, 1, 1)) * 0.3,
        "w2": rng.normal(size=(16, 3, 3, 3)) * 0.4,
        "wr": rng.normal(size=(16, 16, 3, 3)) * 0.1,
    }
    nodes = [
        # a local response normalisation as optimize decomposes one
        helper.make_node("Conv", ["x", "w0"], ["a"], pads=[1, 1, 1, 1], name="conv_a"),
        helper.make_node("Mul", ["a", "a"], ["a_sq"], name="square"),
        helper.make_node("Conv", ["a_sq", "win"], ["a_win"], name="window"),
        helper.make_node("Sigmoid", ["a_win"], ["a_pow"], name="power"),
        helper.make_node("Mul", ["a", "a_pow"], ["y1"], name="normalise"),
        # a squeeze-excite tail: the gate is one row, the same for every stripe
        helper.make_node("Conv", ["x", "w1"], ["b"], pads=[1, 1, 1, 1], name="conv_b"),
        helper.make_node("GlobalAveragePool", ["b"], ["b_pool"], name="pool"),
        helper.make_node("Conv", ["b_pool", "wse"], ["b_se"], name="excite"),
        helper.make_node("HardSigmoid", ["b_se"], ["gate"], name="gate"),
        helper.make_node("Mul", ["b", "gate"], ["b_gated"], name="gated"),
        helper.make_node("Add", ["b", "b_gated"], ["y2"], name="residual_se"),
        # a residual block: its branch needs rows around the stripe's, so it is no region
        helper.make_node("Conv", ["x", "w2"], ["c"], pads=[1, 1, 1, 1], name="conv_c"),
        helper.make_node("Conv", ["c", "wr"], ["c_branch"], pads=[1, 1, 1, 1], name="branch"),
        helper.make_node("Relu", ["c_branch"], ["c_relu"], name="branch_relu"),
        helper.make_node("Add", ["c", "c_relu"], ["y3"], name="residual"),
    ]
    return small_model(
        nodes, "joins", {"x": [1, 3, SIZE, SIZE]}, {y: [1, 16, SIZE, SIZE] for y in OUTPUTS}, weights
    )


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    rng = np.random.default_rng(4)
    model = _model(rng)
    samples = rng.normal(size=(6, 3, SIZE, SIZE)).astype(np.float32)
    return build_int8(model, tmp_path_factory.mktemp("joins"), samples)


def _striping(built, joins: bool):
    return striping_of(built, BUDGET, joins=joins)


def _labels(striping) -> list[list[str]]:
    return sorted(c["layers"] for c in striping.chains) if striping is not None else []


def test_a_branch_that_keeps_rows_and_joins_is_one_region(built):
    model, program, *_ = built
    regions = _labels(_striping(built, joins=True))
    # the whole normalisation from its convolution on (the convolution alone reads x), and the
    # squeeze-excite tail (b is read by the pool too, so b itself comes from DRAM)
    assert ["conv_a", "square", "window", "power", "normalise"] in regions
    assert ["gated", "residual_se"] in regions
    # the residual block's branch needs the rows around each stripe of c: not joined
    assert not any("residual" in r for r in regions)
    # chains alone: no op of two maps in any (the window and its table are one)
    chains = _labels(_striping(built, joins=False))
    assert chains == [["window", "power"]]


def test_every_map_of_a_region_is_read_whole_by_its_stripes(built):
    model, *_ = built
    striping = _striping(built, joins=True)
    shapes = model_shapes(model)
    ops = striping.program.ops
    outputs = [o for op in ops for o in op.outputs]
    assert len(outputs) == len(set(outputs))  # one writer per tensor
    for y in ("y1", "y2"):
        (concat,) = [op for op in ops if op.outputs == [y]]
        spans = sorted(striping.rows[n] for n in concat.inputs)
        assert spans[0][0] == 0 and spans[-1][1] == shapes[y][2]
        assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
    # both ops of a stripe that read one map read the same stripe of it: the square reads its
    # stripe of `a` twice and the normalisation the same one; the tail's two ops read one slice
    for op in ops:
        if op.node in ("square", "normalise", "gated", "residual_se") and op.kind in ("add", "mul"):
            maps = [n for n in op.inputs if n.split("@")[0] in ("a", "b")]
            assert maps and all(striping.rows[n] == striping.rows[op.outputs[0]] for n in maps), op
            if op.node == "gated":
                assert "gate" in op.inputs  # the one-row gate, whole, in every stripe


def test_the_striped_regions_compute_the_codes_and_move_fewer_bytes(built):
    model, program, arrays, interpreter, plan = built
    results = {}
    for striping in (_striping(built, joins=False), _striping(built, joins=True)):
        data, stats = _compile(
            program, arrays, model, SMALL, plan, True, True, Grouping(BUDGET, 0.125, striping)
        )
        assert binary_hazards(data) == []
        assert_computes_the_codes(data, built)
        results[len(striping.chains)] = stats
    assert results[2]["dram_bytes"] < results[1]["dram_bytes"]


def test_the_code_generator_tries_chains_and_regions_and_keeps_the_fastest(built):
    model, program, arrays, interpreter, plan = built
    data, _, stats = compile_npub(program, arrays, model, SMALL, plan)
    tried = {tuple(r["stripes"]) for r in stats["grouping_search"] if r["stripes"]}
    budgets = [int(share * SMALL.sram_kib * 1024) for share in RESIDENT_SHARES]
    programs = [striping for _, striping in stripings(program, arrays, model, plan, budgets)]
    layers = [{name for c in p.chains for name in c["layers"]} for p in programs]
    assert any("normalise" in names for names in layers) and any("normalise" not in n for n in layers)
    assert {tuple(c["stripes"] for c in p.chains) for p in programs} <= tried
    assert stats["estimated_cycles"] <= min(r["estimated_cycles"] for r in stats["grouping_search"]) * 1.01
    assert binary_hazards(data) == []
    assert_computes_the_codes(data, built)
