"""Interval budgets (backend/intervals.py): the op sequence cut into intervals, each with its own
resident budget, by dynamic programming over each op's span at each budget plus the DRAM time of
what a falling budget evicts; and a binary compiled with those budgets (each op's tiles get the
SRAM its interval leaves) computes the integer model's codes without hazards."""

from __future__ import annotations

import numpy as np
from onnx import helper
from test_quantize import SETTINGS

from conftest import integer_variants, small_model
from npubuild.targets import npub
from npubuild.targets.backend.allocation import allocate, verify_allocation
from npubuild.targets.backend.fusion import fuse
from npubuild.targets.backend.intervals import crossing_bytes, interval_budgets
from npubuild.targets.compile import Grouping, _compile, model_shapes, plan_partition
from npubuild.targets.hazards import binary_hazards
from npubuild.targets.runtime import Runtime
from npubuild.targets.spec import BUILTIN_TARGETS


def test_the_budgets_follow_the_spans_unless_a_fall_evicts_more_than_it_saves():
    # budget 0 is cheaper for the first three ops, budget 100 for the last three (10 cycles each)
    spans = {0: [10, 10, 10, 20, 20, 20], 100: [20, 20, 20, 10, 10, 10]}
    # rising from 0 to 100 costs nothing whatever crosses: 0 x 3, then 100 x 3
    assert interval_budgets(spans, [0, 0, 0, 80, 0, 0], 1.0) == [0, 0, 0, 100, 100, 100]
    # the other way round a fall from 100 to 0 evicts min(crossing, 100) bytes, stored and
    # reloaded at 1 byte per cycle: 2 x 8 = 16 cycles < the 30 it saves, so it falls (after the
    # third op: 30 + 16 + 30 = 76 cycles, against 10 + 10 + 21 + 16 + 30 = 87 one op earlier)
    flipped = {0: [21, 21, 21, 10, 10, 10], 100: [10, 10, 10, 20, 20, 20]}
    assert interval_budgets(flipped, [0, 8, 8, 8, 8, 8], 1.0) == [100, 100, 100, 0, 0, 0]
    # 2 x 20 = 40 cycles > 30: it stays at 100 throughout (90 cycles; 0 throughout is 93)
    assert interval_budgets(flipped, [0, 20, 20, 20, 20, 20], 1.0) == [100] * 6


def _model(rng):
    """Four convolutions on a 48 x 48 map: the early ones wide, the late ones narrow."""
    weights = {
        "w0": rng.normal(size=(16, 3, 3, 3)) * 0.4,
        "w1": rng.normal(size=(16, 16, 3, 3)) * 0.1,
        "w2": rng.normal(size=(8, 16, 3, 3)) * 0.1,
        "w3": rng.normal(size=(8, 8, 1, 1)) * 0.3,
    }
    nodes = [
        helper.make_node("Conv", ["x", "w0"], ["a"], pads=[1, 1, 1, 1], name="c0"),
        helper.make_node("Relu", ["a"], ["b"], name="r0"),
        helper.make_node("Conv", ["b", "w1"], ["c"], pads=[1, 1, 1, 1], name="c1"),
        helper.make_node("Relu", ["c"], ["d"], name="r1"),
        helper.make_node("Conv", ["d", "w2"], ["e"], pads=[1, 1, 1, 1], strides=[2, 2], name="c2"),
        helper.make_node("Conv", ["e", "w3"], ["y"], name="c3"),
    ]
    return small_model(nodes, "intervals", {"x": [1, 3, 48, 48]}, {"y": [1, 8, 24, 24]}, weights)


def test_a_binary_with_interval_budgets_computes_the_integer_models_codes(tmp_path):
    rng = np.random.default_rng(12)
    model = _model(rng)
    samples = rng.normal(size=(6, 3, 48, 48)).astype(np.float32)
    program, arrays, interpreter = integer_variants(model, tmp_path, samples, {"int8": SETTINGS})["int8"]
    # a small SRAM, so that what the caps leave the tiles matters
    target = BUILTIN_TARGETS["vnpu-m"].model_copy(update={"name": "vnpu-m-64k", "sram_kib": 64})
    plan = plan_partition(program, arrays, model, target)
    sequence = [i for sg in plan["subgraphs"] if sg["device"] == "npu" for i in sg["ops"]]
    crossing = crossing_bytes(program, model_shapes(model), sequence)
    assert crossing[0] == 0 and max(crossing) > 0
    half = 32 * 1024
    # the first half of the sequence leaves resident tensors nothing, the second half 32 KiB
    caps = tuple((i, 0 if p < len(sequence) // 2 else half) for p, i in enumerate(sequence))
    uniform = _compile(program, arrays, model, target, plan, True, True, Grouping(half, 0.125))
    data, stats = _compile(program, arrays, model, target, plan, True, True, Grouping(half, 0.125, caps=caps))
    assert binary_hazards(data) == []
    assert data != uniform[0]
    # the first half's ops tile with all of SRAM; what stays resident lives in the second half
    shapes = model_shapes(model)
    allocation = allocate(
        program,
        arrays,
        shapes,
        plan,
        64 * 1024,
        fuse(program, plan, shapes),
        True,
        half,
        "definition",
        dict(caps),
    )
    verify_allocation(allocation)
    early = sequence[: len(sequence) // 2]
    assert {i: allocation.tile_sram_at.get(i) for i in early} == {i: 64 * 1024 for i in early}
    assert allocation.resident and stats["resident_tensors"] == len(allocation.resident)
    order = [i for sg in plan["subgraphs"] for i in sg["ops"]]  # the allocator's positions
    for buffer in allocation.buffers:
        if buffer.resident:
            assert not set(order[buffer.first : buffer.last + 1]) & set(early), buffer
    runtime = Runtime(npub.read(data))
    for _ in range(2):
        x = rng.normal(size=(1, 3, 48, 48)).astype(np.float32)
        np.testing.assert_array_equal(runtime.run({"x": x})["y"], interpreter.run({"x": x})[0]["y"])
