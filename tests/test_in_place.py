"""In-place element-wise results (targets/backend/allocation.py): a squeeze-excite tail's
`x + x * gate` writes its result where `x` was, since nothing reads `x` after it; a resident
budget that cannot hold both maps at once then holds both on one place, the allocation checks,
and the binary computes the integer model's codes, hazard-free, with fewer DRAM bytes; the
grouping search tries it as a refinement."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper
from stripe_kit import SMALL, assert_computes_the_codes, build_int8, squeeze_excite_tail

from conftest import small_model
from npubuild.targets.backend.allocation import allocate, verify_allocation
from npubuild.targets.backend.fusion import fuse
from npubuild.targets.compile import Grouping, _compile, compile_npub, model_shapes
from npubuild.targets.hazards import binary_hazards

SIZE = 64
MAP = 16 * SIZE * SIZE  # bytes of one int8 map
BUDGET = MAP * 3 // 2  # one map and a half: never two maps at once


def _tail(rng: np.random.Generator) -> onnx.ModelProto:
    weights = {
        "w0": rng.normal(size=(16, 3, 3, 3)) * 0.4,
        "wse": rng.normal(size=(16, 16, 1, 1)) * 0.3,
        "w1": rng.normal(size=(8, 16, 1, 1)) * 0.3,
    }
    nodes = [
        helper.make_node("Conv", ["x", "w0"], ["fine"], pads=[1, 1, 1, 1], name="fine_conv"),
        *squeeze_excite_tail("fine", "tail"),
        helper.make_node("Conv", ["tail", "w1"], ["y"], name="head"),
    ]
    return small_model(nodes, "tail", {"x": [1, 3, SIZE, SIZE]}, {"y": [1, 8, SIZE, SIZE]}, weights, 13)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    rng = np.random.default_rng(7)
    samples = rng.normal(size=(6, 3, SIZE, SIZE)).astype(np.float32)
    return build_int8(_tail(rng), tmp_path_factory.mktemp("tail"), samples)


def _allocation(built, in_place: bool = True, budget: int = BUDGET, residency: str = "definition"):
    shapes = model_shapes(built.model)
    fusion = fuse(built.program, built.plan, shapes)
    return allocate(
        built.program,
        built.arrays,
        shapes,
        built.plan,
        SMALL.sram_kib * 1024,
        fusion,
        resident_bytes=budget,
        residency=residency,
        in_place=in_place,
    )


def test_the_tail_writes_its_result_where_its_map_was(built):
    allocation = _allocation(built)
    verify_allocation(allocation)
    assert allocation.in_place == {"tail": "fine"}
    assert allocation.resident["tail"] == allocation.resident["fine"]


def _compiled(built, in_place: bool, budget: int = BUDGET) -> tuple[bytes, dict]:
    """The binary at `budget` resident bytes, resident tensors placed shortest-lived first."""
    choice = Grouping(budget, 0.125, None, residency="lifetime", in_place=in_place)
    return _compile(built.program, built.arrays, built.model, SMALL, built.plan, True, True, choice)


def test_in_place_keeps_both_maps_on_chip_and_computes_the_codes(built):
    data, stats = _compiled(built, True)
    assert binary_hazards(data) == []
    assert_computes_the_codes(data, built)
    assert _allocation(built, in_place=False).in_place == {}
    _, apart = _compiled(built, False)
    # apart, one of the two maps goes through DRAM: stored once and read once
    assert stats["dram_bytes"] <= apart["dram_bytes"] - 2 * MAP


def test_the_code_generator_tries_results_in_place(built):
    _, _, stats = compile_npub(built.program, built.arrays, built.model, SMALL, built.plan)
    assert any(t.get("in_place") for t in stats["grouping_search"])


# the chain's maps are larger than the tiles the SRAM left beside them holds: its element-wise ops
# run in several tiles
CHAIN_SIZE = 128
CHAIN_MAP = 16 * CHAIN_SIZE * CHAIN_SIZE
CHAIN_BUDGET = CHAIN_MAP * 3 // 2


def _chain(rng: np.random.Generator) -> onnx.ModelProto:
    """The tail's result is itself the operand of an element-wise op that writes in its place (a
    Sigmoid here; the pyramid join in PP-OCRv4 det): fine -> tail -> act, one map's place. Small
    side convolutions between them make each of the three live longer than the one before, so
    by lifetime `fine` is placed first and `tail` next, while `fine` still holds its bytes."""
    weights = {
        "w0": rng.normal(size=(16, 3, 3, 3)) * 0.4,
        "wse": rng.normal(size=(16, 16, 1, 1)) * 0.3,
        "ws": rng.normal(size=(4, 3, 1, 1)) * 0.5,
        **{f"w{k}": rng.normal(size=(4, 4, 1, 1)) * 0.5 for k in range(2, 10)},
        "w1": rng.normal(size=(8, 16, 1, 1)) * 0.3,
    }
    side = [helper.make_node("Conv", ["x", "ws"], ["s1"], strides=[4, 4], name="s1")]
    side += [helper.make_node("Conv", [f"s{k - 1}", f"w{k}"], [f"s{k}"], name=f"s{k}") for k in range(2, 10)]
    nodes = [
        helper.make_node("Conv", ["x", "w0"], ["fine"], pads=[1, 1, 1, 1], name="fine_conv"),
        *squeeze_excite_tail("fine", "tail"),
        *side[:4],
        helper.make_node("Sigmoid", ["tail"], ["act"], name="act"),
        *side[4:],
        helper.make_node("Conv", ["act", "w1"], ["y"], name="head"),
    ]
    outputs = {"y": [1, 8, CHAIN_SIZE, CHAIN_SIZE], "s9": [1, 4, CHAIN_SIZE // 4, CHAIN_SIZE // 4]}
    return small_model(nodes, "chain", {"x": [1, 3, CHAIN_SIZE, CHAIN_SIZE]}, outputs, weights, 13)


@pytest.fixture(scope="module")
def chained(tmp_path_factory):
    rng = np.random.default_rng(11)
    samples = rng.normal(size=(6, 3, CHAIN_SIZE, CHAIN_SIZE)).astype(np.float32)
    return build_int8(_chain(rng), tmp_path_factory.mktemp("chain"), samples)


def test_a_chain_of_in_place_results_shares_one_place_and_computes_the_codes(chained):
    allocation = _allocation(chained, budget=CHAIN_BUDGET, residency="lifetime")
    verify_allocation(allocation)
    assert allocation.in_place == {"tail": "fine", "act": "tail"}
    assert allocation.resident["fine"] == allocation.resident["tail"] == allocation.resident["act"]
    data, stats = _compiled(chained, True, CHAIN_BUDGET)
    assert binary_hazards(data) == []
    assert_computes_the_codes(data, chained)
    _, apart = _compiled(chained, False, CHAIN_BUDGET)
    # apart, the middle map goes through DRAM: stored once and read once
    assert stats["dram_bytes"] <= apart["dram_bytes"] - 2 * CHAIN_MAP
    # each tile of an op in place reads and writes the map where it lies, and the squeeze-excite
    # pool's tiles of whole channels read theirs there: no copies in or out
    dma = {row["node"]: row["dma_cycles"] for row in stats["layers"]}
    one_copy = CHAIN_MAP / SMALL.sram_bytes_per_cycle
    assert max(dma["gated"], dma["act"], dma["pool"]) < one_copy / 8


DW_SIZE = 96
DW_MAP = 16 * DW_SIZE * DW_SIZE


def _depthwise(rng: np.random.Generator) -> onnx.ModelProto:
    """A 3x3 depthwise convolution between two pointwise ones, its input map resident."""
    weights = {
        "w0": rng.normal(size=(16, 3, 1, 1)) * 0.5,
        "wdw": rng.normal(size=(16, 1, 3, 3)) * 0.4,
        "w1": rng.normal(size=(8, 16, 1, 1)) * 0.3,
    }
    nodes = [
        helper.make_node("Conv", ["x", "w0"], ["map"], name="expand"),
        helper.make_node("Conv", ["map", "wdw"], ["dw"], group=16, pads=[1, 1, 1, 1], name="dw"),
        helper.make_node("Conv", ["dw", "w1"], ["y"], name="project"),
    ]
    shapes = ({"x": [1, 3, DW_SIZE, DW_SIZE]}, {"y": [1, 8, DW_SIZE, DW_SIZE]})
    return small_model(nodes, "depthwise", *shapes, weights, 13)


def test_a_depthwise_convolution_reads_a_resident_map_where_it_lies(tmp_path):
    rng = np.random.default_rng(3)
    samples = rng.normal(size=(4, 3, DW_SIZE, DW_SIZE)).astype(np.float32)
    built = build_int8(_depthwise(rng), tmp_path, samples)
    data, stats = _compiled(built, False, 2 * DW_MAP + DW_MAP // 4)
    assert binary_hazards(data) == []
    assert_computes_the_codes(data, built)
    # tiles of whole channels: each a dense box of the map, read (borders and all) in place; what
    # the DMA still does is load each tile's weights (tiles of rows copied the map in: 5,168
    # cycles, twice one copy's)
    dw = next(row for row in stats["layers"] if row["node"] == "dw")
    assert dw["dma_cycles"] < DW_MAP / SMALL.sram_bytes_per_cycle
