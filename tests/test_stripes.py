"""Stripes (targets/backend/stripes.py): chains of layers whose maps do not fit the resident budget
run as row stripes through the whole chain; the simulator still computes the integer model's codes,
and the DRAM traffic falls."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper
from stripe_kit import SMALL, assert_computes_the_codes, build_int8, striping_of
from test_quantize import SETTINGS

import npubuild.targets.compile as compile_module
from conftest import small_model
from npubuild.targets import npub
from npubuild.targets.backend.fusion import fuse
from npubuild.targets.backend.stripes import MAX_STRIPES, MIN_STRIPE_ROWS, stripe
from npubuild.targets.compile import (
    DRAM_TIE,
    MAX_RESIDENT_SHARE,
    RESIDENT_SHARES,
    Grouping,
    _compile,
    compile_npub,
    model_shapes,
    stripings,
)
from npubuild.targets.cpu_cost import op_work
from npubuild.targets.cycles import roofline
from npubuild.targets.hazards import binary_hazards
from npubuild.targets.runtime import Runtime

SIZE = 96  # SMALL (stripe_kit): the test model's 96 x 96 maps do not stay resident whole


def _model(rng: np.random.Generator) -> onnx.ModelProto:
    """Three chains read `t`: one starts with a 1x1 convolution (HardSwish, a stride-2 depthwise
    convolution with its pads on one side, a Mul by a per-channel constant, a 1x1 convolution),
    the other with a Mul by a constant (so its stripes slice `t`), a dilated 3x3 convolution and a
    strided one; the third, as long as the second, slices `t` as well; the fourth runs a strided
    convolution then two transposed ones (the first with pads and output padding, as PP-OCR det's
    head has them), the fifth starts with a transposed one (reading its rows of `t` through a
    window). Narrow layers on wide maps: moving the maps costs more than computing them."""
    weights = {
        "w0": rng.normal(size=(16, 3, 3, 3)) * 0.4,
        "w1": rng.normal(size=(16, 16, 1, 1)) * 0.3,
        "wd": rng.normal(size=(16, 1, 3, 3)) * 0.4,
        "g": rng.uniform(0.5, 1.5, size=(1, 16, 1, 1)),
        "w2": rng.normal(size=(8, 16, 1, 1)) * 0.3,
        "k": np.array(0.7),
        "w3": rng.normal(size=(4, 16, 3, 3)) * 0.1,
        "w4": rng.normal(size=(8, 4, 3, 3)) * 0.2,
        "k2": np.array(1.3),
        "w5": rng.normal(size=(4, 16, 3, 3)) * 0.1,
        "w6": rng.normal(size=(8, 4, 1, 1)) * 0.2,
        "w7": rng.normal(size=(8, 16, 3, 3)) * 0.1,
        "wt1": rng.normal(size=(8, 8, 3, 3)) * 0.2,  # ConvTranspose: [in, out, kh, kw]
        "wt2": rng.normal(size=(8, 4, 2, 2)) * 0.3,
        "wt3": rng.normal(size=(16, 4, 2, 2)) * 0.2,
        "w8": rng.normal(size=(4, 4, 3, 3)) * 0.3,
    }
    nodes = [
        helper.make_node("Conv", ["x", "w0"], ["t0"], pads=[1, 1, 1, 1], name="conv0"),
        helper.make_node("Relu", ["t0"], ["t"], name="relu0"),
        # chain 1
        helper.make_node("Conv", ["t", "w1"], ["a0"], name="conv1"),
        helper.make_node("HardSwish", ["a0"], ["a1"], name="hswish1"),
        helper.make_node(
            "Conv", ["a1", "wd"], ["a2"], group=16, strides=[2, 2], pads=[0, 0, 1, 1], name="dw"
        ),
        helper.make_node("Mul", ["g", "a2"], ["a3"], name="gain"),
        helper.make_node("Conv", ["a3", "w2"], ["y1"], name="conv2"),
        # chain 2
        helper.make_node("Mul", ["t", "k"], ["b0"], name="scale"),
        helper.make_node("Conv", ["b0", "w3"], ["b1"], pads=[2, 2, 2, 2], dilations=[2, 2], name="conv3"),
        helper.make_node("Relu", ["b1"], ["b2"], name="relu3"),
        helper.make_node("Conv", ["b2", "w4"], ["y2"], pads=[1, 1, 1, 1], strides=[2, 2], name="conv4"),
        # chain 3: as long as chain 2 and slicing `t` too
        helper.make_node("Mul", ["t", "k2"], ["c0"], name="scale2"),
        helper.make_node("Conv", ["c0", "w5"], ["c1"], pads=[1, 1, 1, 1], name="conv5"),
        helper.make_node("Conv", ["c1", "w6"], ["y3"], strides=[2, 2], name="conv6"),
        # chain 4: 96 -> 48 -> 96 -> 192 rows
        helper.make_node("Conv", ["t", "w7"], ["d0"], pads=[1, 1, 1, 1], strides=[2, 2], name="conv7"),
        helper.make_node(
            "ConvTranspose", ["d0", "wt1"], ["d1"], strides=[2, 2], pads=[1, 1, 1, 1], output_padding=[1, 1],
            name="up1",
        ),
        helper.make_node("Relu", ["d1"], ["d2"], name="relu_up1"),
        helper.make_node("ConvTranspose", ["d2", "wt2"], ["y4"], strides=[2, 2], name="up2"),
        # chain 5: a transposed convolution first
        helper.make_node("ConvTranspose", ["t", "wt3"], ["e0"], strides=[2, 2], name="up3"),
        helper.make_node("Relu", ["e0"], ["e1"], name="relu_up3"),
        helper.make_node("Conv", ["e1", "w8"], ["y5"], pads=[1, 1, 1, 1], strides=[2, 2], name="conv8"),
    ]  # fmt: skip
    half = SIZE // 2
    return small_model(
        nodes,
        "chains",
        {"x": [1, 3, SIZE, SIZE]},
        {
            **{y: [1, 8, half, half] for y in ("y1", "y2", "y3")},
            "y4": [1, 4, 2 * SIZE, 2 * SIZE],
            "y5": [1, 4, SIZE, SIZE],
        },
        weights,
    )


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    rng = np.random.default_rng(3)
    model = _model(rng)
    samples = rng.normal(size=(6, 3, SIZE, SIZE)).astype(np.float32)
    return build_int8(model, tmp_path_factory.mktemp("stripes"), samples)


def test_both_chains_are_cut_into_stripes_that_cover_their_result(built):
    model, program, _, _, _ = built
    striping = striping_of(built, 64 * 1024)
    assert striping is not None
    layers = [c["layers"] for c in striping.chains]
    # conv0 + relu0 make t, which both chains read (a ReLU is its convolution's clamp)
    assert sorted(layers) == [
        ["conv1", "hswish1", "dw", "gain", "conv2"],
        ["conv7", "up1", "up2"],
        ["scale", "conv3", "conv4"],
        ["scale2", "conv5", "conv6"],
        ["up3", "conv8"],
    ]
    outputs = [o for op in striping.program.ops for o in op.outputs]
    assert len(outputs) == len(set(outputs))  # every tensor has one writer (two chains' slices of t)
    shapes = model_shapes(model)
    for y in ("y1", "y2", "y3", "y4", "y5"):
        (concat,) = [op for op in striping.program.ops if op.outputs == [y]]
        spans = sorted(striping.rows[n] for n in concat.inputs)
        assert spans[0][0] == 0 and spans[-1][1] == shapes[y][2]
        assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))  # the result's rows, once each
    # the Mul-first and transposed-first chains read t through slices, the conv-first ones read
    # t where it lies
    slices = [op for op in striping.program.ops if op.op_type == "Slice"]
    assert slices and {op.node for op in slices} == {"scale", "scale2", "up3"}
    assert striping.halo_macs > 0


def test_striped_binary_computes_the_integer_models_codes(built):
    model, program, arrays, interpreter, plan = built
    budget = 64 * 1024
    striping = striping_of(built, budget)
    data, stats = _compile(program, arrays, model, SMALL, plan, True, True, Grouping(budget, 0.125, striping))
    assert stats["stripes"] == striping.chains
    assert binary_hazards(data) == []
    # the Mul-first chains' slices are windows of t their Muls read through (windows.py): no copy
    assert [row["kind"] for row in stats["layers"]].count("move") == 0
    # and each stripe's last op writes its rows at their place in the chain's result, with the
    # result's strides (allocation._pieces_in_concat): the Concats copy nothing
    assert [row["kind"] for row in stats["layers"]].count("concat") == 0
    assert_computes_the_codes(data, built)
    # the bound counts the network's work once: not the halo's rows, which the stripes execute
    # (and the input rows two tiles of a transposed convolution both read, which any tiling does)
    plain = _compile(program, arrays, model, SMALL, plan, True, True, Grouping(budget, 0.125))[1]
    network = sum(op_work(op, model_shapes(model), arrays)[0] for op in program.ops)
    assert stats["macs"] >= network + striping.halo_macs > network and plain["macs"] >= network
    assert (
        stats["roofline_cycles"]
        == plain["roofline_cycles"]
        == roofline(network, plain["compulsory_dram_bytes"], SMALL.model_dump())
    )
    assert stats["dram_bytes"] < plain["dram_bytes"]


def test_the_code_generator_keeps_stripes_where_they_are_faster(built):
    model, program, arrays, interpreter, plan = built
    data, _, stats = compile_npub(program, arrays, model, SMALL, plan)
    striped = [r for r in stats["grouping_search"] if r["striped_chains"]]
    assert striped  # tried
    fastest = min(r["estimated_cycles"] for r in stats["grouping_search"])
    assert stats["stripes"] and stats["estimated_cycles"] <= fastest * (1 + DRAM_TIE)
    unstriped = min(r["estimated_cycles"] for r in stats["grouping_search"] if not r["striped_chains"])
    assert stats["estimated_cycles"] < unstriped
    x = np.random.default_rng(9).normal(size=(1, 3, SIZE, SIZE)).astype(np.float32)
    got, want = Runtime(npub.read(data)).run({"x": x}), interpreter.run({"x": x})[0]
    for y in ("y1", "y2", "y3", "y4", "y5"):
        np.testing.assert_array_equal(got[y], want[y], err_msg=y)


def test_the_grouping_search_tries_each_striped_program_in_lifetime_order_at_once(built):
    """A striped program is compiled in definition order and at once in lifetime order (whether
    it beats its budget unstriped, which decides its refinements, often shows only in that order)."""
    model, program, arrays, _, plan = built
    _, _, stats = compile_npub(program, arrays, model, SMALL, plan)
    rows = stats["grouping_search"]
    keys = ("resident_bytes", "const_slot_bytes", "stripes", "join_constants")
    same = lambda a, b: {key: a[key] for key in keys} == {key: b[key] for key in keys}  # noqa: E731
    # the striped programs' first attempts follow the grid of unstriped choices (a pinned one,
    # after each pair, only where a table is shared: none in this model)
    budgets = [int(share * SMALL.sram_kib * 1024) for share in RESIDENT_SHARES]
    programs = stripings(program, arrays, model, plan, budgets)
    start = next(k for k, r in enumerate(rows) if r["stripes"])
    firsts = rows[start : start + 2 * len(programs)]
    assert len(programs) >= 2 and not any("pinned_tables" in r for r in firsts)
    assert [r["stripes"] for r in firsts[::2]] == [[c["stripes"] for c in s.chains] for _, s in programs]
    for definition, lifetime in zip(firsts[::2], firsts[1::2]):
        assert (definition["residency"], lifetime["residency"]) == ("definition", "lifetime")
        assert same(definition, lifetime)


def test_the_grouping_search_looks_past_its_top_share_while_that_wins(built):
    """The grid's shares stop at half the SRAM; where the fastest choice keeps its tensors in the
    top share, the search tries that choice with the share halfway to all of the SRAM (its chains
    striped anew too), and goes on while the new share is the fastest's. This model's maps fit
    three quarters of the target's SRAM better than half."""
    model, program, arrays, _, plan = built
    data, _, stats = compile_npub(program, arrays, model, SMALL, plan)
    rows = stats["grouping_search"]
    sram = SMALL.sram_kib * 1024
    shares = [max(RESIDENT_SHARES)]
    while shares[-1] < MAX_RESIDENT_SHARE:
        shares.append((shares[-1] + 1) / 2)
    budgets = [int(share * sram) for share in shares]
    past = [k for k, r in enumerate(rows) if r["resident_bytes"] > budgets[0]]
    assert past and stats["resident_bytes"] > budgets[0]
    # each budget past the grid is tried after the fastest so far kept the one below it
    for below, budget in zip(budgets, budgets[1:]):
        first = next((k for k in past if rows[k]["resident_bytes"] == budget), None)
        if first is None:
            break
        fastest = min(rows[:first], key=lambda r: r["estimated_cycles"])
        assert fastest["resident_bytes"] == below
    within = min(r["estimated_cycles"] for r in rows if r["resident_bytes"] <= budgets[0])
    assert stats["estimated_cycles"] < within
    assert_computes_the_codes(data, built)
    assert binary_hazards(data) == []


def test_finer_stripes_are_twice_as_many_and_compute_the_same_codes(built):
    model, program, arrays, interpreter, plan = built
    budget = 128 * 1024
    shapes = model_shapes(model)
    fusion = fuse(program, plan, shapes)
    coarse = stripe(program, arrays, shapes, plan, fusion, budget)
    finer = stripe(program, arrays, shapes, plan, fusion, budget, finer=True)
    assert [c["layers"] for c in finer.chains] == [c["layers"] for c in coarse.chains]
    last_rows = {op.label: shapes[op.outputs[0]][2] for op in program.ops}
    for c, f in zip(coarse.chains, finer.chains):
        # twice the stripes, unless MAX_STRIPES or the rows per stripe stop it
        rows = last_rows[c["layers"][-1]]
        stopped = c["stripes"] == MAX_STRIPES or rows // (2 * c["stripes"]) < MIN_STRIPE_ROWS
        assert f["stripes"] == (c["stripes"] if stopped else 2 * c["stripes"])
    assert finer.chains != coarse.chains
    data, stats = _compile(program, arrays, model, SMALL, plan, True, True, Grouping(budget, 0.125, finer))
    assert stats["stripes"] == finer.chains and binary_hazards(data) == []
    assert_computes_the_codes(data, built)


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    """The model with conv1's result at 16 bits (as a mixed-precision table makes PP-OCR det's
    stem): its first chain's maps double, and at the stripe count that fits half the budget
    some of them no longer stay resident."""
    rng = np.random.default_rng(3)
    model = _model(rng)
    samples = rng.normal(size=(6, 3, SIZE, SIZE)).astype(np.float32)
    settings = {**SETTINGS, "overrides": [{"match": "conv1", "bits": 16}]}
    return build_int8(model, tmp_path_factory.mktemp("wide"), samples, settings)


def _finer_tried_where_the_fastest_striping_spilled(model, program, arrays, plan) -> tuple[bytes, dict, dict]:
    """compile_npub's result, after checking that it tried finer stripes at exactly the budgets
    whose fastest striped program left some of its stripes' maps out of SRAM (where finer stripes
    are another program)."""
    data, _, stats = compile_npub(program, arrays, model, SMALL, plan)
    shapes = model_shapes(model)
    fusion = fuse(program, plan, shapes)
    rows = stats["grouping_search"]
    spilled, finer_tried, finer_counts = set(), set(), {}
    for budget in {r["resident_bytes"] for r in rows}:
        finer = stripe(program, arrays, shapes, plan, fusion, budget, finer=True)
        coarse = stripe(program, arrays, shapes, plan, fusion, budget)
        if finer is None or finer.chains == coarse.chains:
            continue
        counts = finer_counts[budget] = [c["stripes"] for c in finer.chains]
        striped = [
            r for r in rows if r["resident_bytes"] == budget and r["stripes"] and r["stripes"] != counts
        ]
        if min(striped, key=lambda r: r["estimated_cycles"])["stripe_spills"]:
            spilled.add(budget)
        if any(r["resident_bytes"] == budget and r["stripes"] == counts for r in rows):
            finer_tried.add(budget)
    assert finer_tried == spilled
    return data, stats, {b: finer_counts[b] for b in spilled}


def test_finer_stripes_are_tried_where_the_fastest_striping_spilled_and_win_there(wide, monkeypatch):
    # at the grid's budgets: past them (test_the_grouping_search_looks_past_its_top_share_while_
    # that_wins) this model's maps stay resident in coarser stripes, which then win
    monkeypatch.setattr(compile_module, "MAX_RESIDENT_SHARE", max(RESIDENT_SHARES))
    model, program, arrays, interpreter, plan = wide
    data, stats, finer = _finer_tried_where_the_fastest_striping_spilled(model, program, arrays, plan)
    rows = stats["grouping_search"]
    assert any(r.get("stripe_spills") for r in rows)  # the 16-bit maps do not all stay resident
    # the binary kept is a finer striping whose stripe maps all stay resident, faster than any
    # coarse one
    kept = [c["stripes"] for c in stats["stripes"]]
    assert kept in finer.values()
    coarse = [r for r in rows if r["stripes"] and r["stripes"] != kept]
    assert coarse and stats["stripe_spills"] == 0
    assert stats["estimated_cycles"] < min(r["estimated_cycles"] for r in coarse)
    assert binary_hazards(data) == []
    assert_computes_the_codes(data, wide)


def test_at_8_bits_the_same_rule_holds(built):
    model, program, arrays, _, plan = built
    _finer_tried_where_the_fastest_striping_spilled(model, program, arrays, plan)
