"""Pinned tables (targets/backend/pinning.py): a lookup table that the stripes of a chain all read
loads into SRAM once, and the binary still computes the integer model's codes."""

from __future__ import annotations

import numpy as np
import pytest
from stripe_kit import SMALL, assert_computes_the_codes, build_int8, striping_of
from test_quantize import SETTINGS
from test_stripes import SIZE, _model

from conftest import npu_instructions
from npubuild.targets import npub
from npubuild.targets.backend.context import OpContext
from npubuild.targets.backend.fusion import fuse
from npubuild.targets.backend.memory import SramPlan
from npubuild.targets.backend.pinning import pinned_tables
from npubuild.targets.compile import Grouping, _compile, compile_npub, model_shapes
from npubuild.targets.hazards import binary_hazards

BUDGET = 64 * 1024


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """test_stripes' model with conv1's result at 16 bits (as a mixed-precision table makes PP-OCR
    det's stem): its HardSwish is then a lookup-table op of its own with a 64 KiB table, which
    each stripe of the first chain reads."""
    rng = np.random.default_rng(3)
    model = _model(rng)
    samples = rng.normal(size=(6, 3, SIZE, SIZE)).astype(np.float32)
    settings = {**SETTINGS, "overrides": [{"match": "conv1", "bits": 16}]}
    built = build_int8(model, tmp_path_factory.mktemp("pinning"), samples, settings)
    return built, striping_of(built, BUDGET)


def _tables(program, arrays, shapes, plan) -> dict[str, int]:
    ctx = OpContext(program.tensors, shapes, arrays, SramPlan(0))
    npu = [i for sg in plan["subgraphs"] if sg["device"] == "npu" for i in sg["ops"]]
    return pinned_tables(ctx, program.ops, npu, fuse(program, plan, shapes))


def test_only_a_table_several_ops_read_is_shared(built):
    (model, program, arrays, _, plan), striping = built
    assert _tables(program, arrays, model_shapes(model), plan) == {}  # one HardSwish, one reader
    tables = _tables(striping.program, striping.arrays, striping.shapes, striping.plan)
    readers = [op for op in striping.program.ops if op.kind == "lut"]
    assert len(readers) > 1 and {op.node for op in readers} == {"hswish1"}
    assert list(tables.values()) == [2**16]  # 65,536 entries of 8 bits


def _table_loads(data: bytes) -> list:
    return [i for i in npu_instructions(npub.read(data)) if i.op == "load" and i.args["d3"] == 2**16]


def test_a_table_the_stripes_share_loads_once(built):
    (model, program, arrays, _, plan), striping = built
    results = {
        pin: _compile(
            program, arrays, model, SMALL, plan, True, True, Grouping(BUDGET, 0.25, striping, pin_tables=pin)
        )
        for pin in ("", "shared")
    }
    stripes = sum(op.node == "hswish1" for op in striping.program.ops)
    assert len(_table_loads(results[""][0])) == stripes > 1
    (pinned_load,) = _table_loads(results["shared"][0])
    assert results["shared"][1]["pinned_tables"] == 1
    # the table lies above every op's tiles and constants, just below the resident tensors
    assert pinned_load.args["sram"] == SMALL.sram_kib * 1024 - BUDGET - 2**16
    saved = results[""][1]["dram_bytes"] - results["shared"][1]["dram_bytes"]
    assert saved == (stripes - 1) * 2**16
    for pin, (data, _) in results.items():
        assert binary_hazards(data) == [], pin
        assert_computes_the_codes(data, built[0])


def test_the_grouping_search_tries_pinned_tables(built):
    (model, program, arrays, _, plan), _ = built
    _, _, stats = compile_npub(program, arrays, model, SMALL, plan)
    rows = [r for r in stats["grouping_search"] if "pinned_tables" in r]
    assert rows and all(r["pinned_tables"] == 1 and r["striped_chains"] for r in rows)
