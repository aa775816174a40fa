"""The back end's phases on their own (targets/backend/): allocation and its checker, scheduling,
lowering of the tile command stream, each on small hand-made integer programs."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from npubuild.intmodel.program import IntegerModel
from npubuild.targets.backend.allocation import AllocationError, allocate, verify_allocation
from npubuild.targets.backend.commands import (
    ConstLoads,
    InConst,
    InTile,
    Step,
    Tile,
    const_box,
    const_load,
    load,
    store,
)
from npubuild.targets.backend.constants import pack_constants
from npubuild.targets.backend.context import ConstantPool, OpContext
from npubuild.targets.backend.fusion import Fusion, fuse
from npubuild.targets.backend.lowering import SLOT_TOKENS, T_CONST, T_DONE, T_IN, T_STORED, Lowering
from npubuild.targets.backend.memory import CHANNEL_PARAM_BYTES, DoesNotFit, SramPlan
from npubuild.targets.backend.schedule import schedule
from npubuild.targets.cycles import Timeline
from npubuild.targets.isa import NO_SIGNAL, Instruction
from npubuild.targets.spec import BUILTIN_TARGETS


def _chain(n: int, shape=(1, 8, 16, 16)) -> tuple[dict, dict, dict]:
    """x -> clamp -> t1 -> clamp -> ... -> t{n}: one NPU subgraph of n element-wise ops."""
    names = ["x", *(f"t{k}" for k in range(1, n + 1))]
    ops = [
        {
            "kind": "clamp",
            "op_type": "Clip",
            "inputs": [a],
            "outputs": [b],
            "attrs": {"min": -128, "max": 127},
        }
        for a, b in zip(names, names[1:])
    ]
    tensors = {t: {"bits": 8, "zero_point": 0, "scale": 1.0} for t in names}
    program = IntegerModel.model_validate(
        {"ops": ops, "tensors": tensors, "inputs": ["x"], "outputs": [names[-1]]}
    )
    plan = {"subgraphs": [{"device": "npu", "ops": list(range(n))}]}
    return program, plan, {t: list(shape) for t in names}


def test_allocation_reuses_dead_buffers_and_passes_its_checker():
    program, plan, shapes = _chain(6)
    alloc = allocate(program, {}, shapes, plan, 1 << 20, Fusion())
    verify_allocation(alloc)
    # a chain needs two live tensors at a time, plus the network's input and output (live to the end)
    assert len({a for n, a in alloc.addr.items() if n not in ("x", "t6")}) == 2
    flat = allocate(program, {}, shapes, plan, 1 << 20, Fusion(), reuse=False)
    verify_allocation(flat)
    assert len(set(flat.addr.values())) == 7


def test_resident_tensors_stay_inside_the_resident_area():
    program, plan, shapes = _chain(6)
    alloc = allocate(program, {}, shapes, plan, 1 << 20, Fusion(), resident_bytes=1 << 14)
    verify_allocation(alloc)
    assert alloc.resident and "x" not in alloc.resident and "t6" not in alloc.resident
    assert all((1 << 20) - (1 << 14) <= a < (1 << 20) for a in alloc.resident.values())
    assert alloc.tile_sram == (1 << 20) - (1 << 14)


@pytest.mark.parametrize(
    "corrupt, message",
    [
        (lambda b, other: dataclasses.replace(b, start=other.start), "share bytes"),
        (lambda b, other: dataclasses.replace(b, start=b.start + 8), "not aligned"),
        (lambda b, other: dataclasses.replace(b, size=64), "ends past its buffer"),
    ],
    ids=["overlap", "misaligned", "too-small"],
)
def test_the_checker_catches_a_broken_allocation(corrupt, message):
    program, plan, shapes = _chain(4)
    alloc = allocate(program, {}, shapes, plan, 1 << 20, Fusion())
    by_root = {b.root: b for b in alloc.buffers}
    # t1 and t2 are live together (t2 is computed from t1): they must not share bytes
    broken = corrupt(by_root["t2"], by_root["t1"])
    alloc.buffers = [broken if b.root == "t2" else b for b in alloc.buffers]
    if message != "ends past its buffer":
        alloc.addr["t2"] = broken.start
    with pytest.raises(AllocationError, match=message):
        verify_allocation(alloc)


def test_a_buffer_reused_after_its_tensor_died_is_no_overlap():
    program, plan, shapes = _chain(4)
    alloc = allocate(program, {}, shapes, plan, 1 << 20, Fusion())
    by_root = {b.root: b for b in alloc.buffers}
    assert by_root["t1"].start == by_root["t3"].start  # t1 is dead once t2 is computed
    assert by_root["t1"].last < by_root["t3"].first


def _ctx(program, shapes, sram_bytes: int, const_slot: int = 0) -> OpContext:
    return OpContext(program.tensors, shapes, {}, SramPlan(sram_bytes, const_slot))


def test_schedule_shrinks_outer_axes_first_and_splits_for_pipelining():
    program, _, shapes = _chain(1, shape=(1, 8, 64, 64))
    op = program.ops[0]
    whole = schedule(_ctx(program, shapes, 1 << 20), op)
    assert whole.extents == (1, 8, 64, 64)  # 32 KiB in, 32 KiB out, twice: fits 1 MiB
    small = schedule(_ctx(program, shapes, 16 * 1024), op)
    assert small.extents[1] < 8 and small.extents[2:] == (64, 64)  # channels go before rows
    assert 2 * small.per_tile <= 16 * 1024
    split = schedule(_ctx(program, shapes, 16 * 1024), op, split=2)
    assert split.extents[1] == -(-small.extents[1] // 2)


def test_a_fully_connected_layer_streams_weight_chunks_as_wide_as_fit():
    """Halving 4,096 outputs stops at 16 per chunk where 21 fit the slot: the weights go in 196
    equal chunks of 21 (each a DMA latency), not 256 of 16 (ZFNet-512's FC6)."""
    k, n = 18432, 4096
    tensors = {t: {"bits": 8, "zero_point": 0, "scale": 1.0} for t in ("x", "y")}
    names = {f: f"fc.{f}" for f in ("weight", "bias", "m0", "shift", "weight_scale")}
    program = IntegerModel.model_validate(
        {
            "ops": [
                {
                    "kind": "matmul",
                    "op_type": "Gemm",
                    "inputs": ["x", names["weight"]],
                    "outputs": ["y"],
                    "attrs": {"min": -128, "max": 127},
                    "arrays": names,
                }
            ],
            "tensors": tensors,
            "inputs": ["x"],
            "outputs": ["y"],
        }
    )
    arrays = {names["weight"]: np.zeros((k, n), np.int8)}
    slot = 384 * 1024
    ctx = OpContext(program.tensors, {"x": [1, k], "y": [1, n]}, arrays, SramPlan(1 << 20, slot))
    sched = schedule(ctx, program.ops[0])
    _, width = sched.extents
    per_output = k + CHANNEL_PARAM_BYTES
    assert width * per_output <= slot < (width + 1) * per_output  # as wide as fits
    assert -(-n // width) == -(-n // (slot // per_output))  # the fewest chunks
    assert -(-n // width) * width - n < -(-n // width)  # equal chunks: the last short by < 1 each


def test_an_op_that_cannot_be_tiled_does_not_fit():
    program, _, shapes = _chain(1)
    with pytest.raises(DoesNotFit):
        schedule(_ctx(program, shapes, 128), program.ops[0])  # not even one element, twice


def test_a_fused_activation_leaves_no_intermediate():
    conv_attrs = {"strides": [1, 1], "pads": [0] * 4, "dilations": [1, 1], "group": 1, "transpose": False}
    arrays = {"weight": "w", "bias": "b", "m0": "m", "shift": "s", "weight_scale": "ws"}
    ops = [
        {
            "kind": "conv",
            "inputs": ["x"],
            "outputs": ["c"],
            "attrs": {**conv_attrs, "min": -128, "max": 127},
            "arrays": arrays,
        },
        {
            "kind": "lut",
            "inputs": ["c"],
            "outputs": ["y"],
            "attrs": {"offset": 128},
            "arrays": {"table": "t"},
        },
    ]
    tensors = {t: {"bits": 8, "zero_point": 0, "scale": 1.0} for t in "xcy"}
    program = IntegerModel.model_validate({"ops": ops, "tensors": tensors, "inputs": ["x"], "outputs": ["y"]})
    fusion = fuse(program, {"subgraphs": [{"device": "npu", "ops": [0, 1]}]})
    assert fusion.activation == {0: 1} and fusion.fused_away == {"c"} and fusion.absorbed == {1}
    apart = fuse(program, {"subgraphs": [{"device": "npu", "ops": [0]}, {"device": "npu", "ops": [1]}]})
    assert apart.activation == {}  # not across subgraphs


CLAMP = _chain(1)[0].ops[0]


def _tile(n: int = 64, buffers: tuple[int, int] = (1000, 2000)) -> Tile:
    box, strides = [1, 1, 1, n], [0, 0, 0, 1]
    compute = Step("clamp", {"src": InTile(), "n": n, "bits": 8, "min": 0, "max": 1, "dst": InTile(n)})
    return Tile(
        buffers,
        [load(InTile(), 0, 8, box, strides, [0] * 4)],
        compute,
        store(InTile(n), 4096, 8, box, strides, [0] * 4),
    )


def test_lowering_alternates_buffers_and_chains_the_tokens():
    lowering = Lowering(SramPlan(1 << 16))
    lowering.add_op(CLAMP, [_tile() for _ in range(3)])
    code, marks = lowering.finish()
    # the second tile's load joins the first's, ahead of the first compute (see below)
    assert [i.op for i in code] == [
        "load",
        "load",
        "clamp",
        "store",
        "clamp",
        "store",
        "load",
        "clamp",
        "store",
        "end",
    ]
    assert marks[0][0] == 0
    loads = [i for i in code if i.op == "load"]
    assert [i.args["sram"] for i in loads] == [1000, 2000, 1000]
    assert [i.signal for i in loads] == [T_IN[0], T_IN[1], T_IN[0]]
    # the first two tiles wait for every store and compute before the op (an op that wrote a
    # resident tensor in place signals no store); the third only for tile 1's store
    both = (1 << T_STORED[0]) | (1 << T_STORED[1]) | (1 << T_DONE[0]) | (1 << T_DONE[1])
    assert [i.wait for i in loads] == [both, both, 1 << T_STORED[0]]
    assert code[2].args["dst"] == 1064 and code[2].signal == T_DONE[0]
    assert code[2].wait == (1 << T_IN[0]) | (1 << T_STORED[0]) | 1
    assert code[3].wait == 1 << T_DONE[0] and code[3].signal == T_STORED[0]
    # a wait names the latest signal before it in the stream: placed after the first tile's
    # compute and store, the second load would wait for them and the two tiles would not overlap
    timeline = Timeline(BUILTIN_TARGETS["vnpu-m"].model_dump())
    spans = [timeline.add(i) for i in code]
    assert spans[1][0] < spans[2][1]  # the second load starts before the first compute ends


def test_each_weight_chunk_s_second_tile_loads_while_its_first_computes():
    """An op whose weights come in chunks (a constant group each) runs each chunk's tiles as an op
    runs its own: the chunk's second tile loads before its first computes, in the other buffer
    (Silero VAD's STFT convolution in two chunks: the fourth tile's load sat behind the third's
    compute and store, and the constant groups hoisted after the third's load)."""
    lowering = Lowering(SramPlan(1 << 16, const_slot=4096))
    chunk = [ConstLoads([const_load(0, 0, 64)]), _tile(), _tile()]
    lowering.add_op(CLAMP, [*chunk, ConstLoads([const_load(0, 64, 64)]), _tile(), _tile()])
    code, _ = lowering.finish()
    tile_loads = [k for k, i in enumerate(code) if i.op == "load" and i.args["sram"] in (1000, 2000)]
    assert len(tile_loads) == 4
    first, second = tile_loads[2:]
    assert second == first + 1, [i.op for i in code]  # no compute or store between them
    timeline = Timeline(BUILTIN_TARGETS["vnpu-m"].model_dump())
    spans = [timeline.add(i) for i in code]
    third_compute = next(k for k in range(first, len(code)) if code[k].op == "clamp")
    assert spans[second][0] < spans[third_compute][1]  # it loads while the third tile computes


def test_constant_groups_alternate_slots_and_hoist_ahead():
    lowering = Lowering(SramPlan(1 << 16, const_slot=4096))
    group = ConstLoads([const_load(0, 0, 64), const_load(64, 64, 64)])
    with_table = [group, _tile(), ConstLoads([const_load(0, 128, 64)]), _tile()]
    lowering.add_op(CLAMP, with_table)
    code, marks = lowering.finish()
    consts = [i for i in code if i.op == "load" and i.args["sram"] not in (1000, 2000)]  # not tile loads
    # the first group goes to slot 0 (token 0), the second to slot 1 (token 7); only a group's
    # last load signals
    assert [(i.args["sram"], i.signal) for i in consts[:2]] == [(0, NO_SIGNAL), (64, SLOT_TOKENS[0])]
    assert (consts[2].args["sram"], consts[2].signal) == (4096, SLOT_TOKENS[1])
    # hoisted: the second group loads right after the first tile's input, before its compute
    ops = [(i.op, i.args.get("dram")) for i in code]
    assert ops.index(("load", 128)) == 3 and code[4].op == "clamp"
    assert code[-2].op == "store" and code[-1].op == "end"
    assert marks[0][0] == 0


def test_a_constant_group_loads_as_one_record_and_unread_arrays_leave_the_pool():
    """A group of a table, a strided block of a weight matrix's columns and the block's
    parameters becomes one load whose bytes are what the three loads put into the constant area
    (the gaps zero); compaction then drops the arrays only the record reads and moves the rest."""
    rng = np.random.default_rng(0)
    table = rng.integers(-128, 128, 40, dtype=np.int8)
    matrix = rng.integers(-128, 128, (6, 10), dtype=np.int8)  # k x n, columns 3..6 wanted
    params = rng.integers(-(2**40), 2**40, (4, 3), dtype=np.int64)
    other = rng.integers(-128, 128, 100, dtype=np.int8)
    pool = ConstantPool(base=1 << 20)
    taddr, waddr = pool.add("table", table), pool.add("matrix", matrix)
    paddr, oaddr = pool.add("params", params), pool.add("other", other)

    def group() -> ConstLoads:
        return ConstLoads(
            [
                const_load(0, taddr, table.nbytes),
                const_box(64, waddr, [1, 1, 6, 4], [0, 0, 10, 1], [0, 0, 0, 3]),
                const_load(128, paddr, params.nbytes),
            ]
        )

    [packed] = pack_constants(pool, [group()])
    [record] = packed.loads
    assert record.args["sram"] == InConst(0) and record.args["d3"] == 128 + params.nbytes
    expected = np.zeros(128 + params.nbytes, np.uint8)
    expected[:40] = table.view(np.uint8)
    expected[64:88] = matrix[:, 3:7].reshape(-1).view(np.uint8)
    expected[128:] = params.reshape(-1).view(np.uint8)
    np.testing.assert_array_equal(pool.image(record), expected)
    # the same group again reads the same record; other bytes make another
    assert pack_constants(pool, [group()])[0].loads[0].args["dram"] == record.args["dram"]
    other_group = ConstLoads([const_load(0, taddr, 40), const_load(64, waddr + 3, 1)])
    assert pack_constants(pool, [other_group])[0].loads[0].args["dram"] != record.args["dram"]
    record_name = next(k for k, at in pool.keys.items() if at == record.args["dram"])
    code = [
        Instruction("load", dict(record.args, sram=0)),
        Instruction("load", dict(const_load(0, oaddr + 10, 20).args, sram=0)),
        Instruction("load", dict(space=0, dram=64, sram=0, esize=1, d0=1, d1=1, d2=1, d3=8)),  # a tensor
    ]
    pool.compact([code])
    assert sorted(pool.keys) == sorted(["other", record_name])  # the table, matrix, params: only in it
    assert code[2].args["dram"] == 64
    other_at = pool.keys["other"] - pool.base
    np.testing.assert_array_equal(pool.image(Step("load", code[1].args)), other[10:30].view(np.uint8))
    assert bytes(pool.data[other_at : other_at + 100]) == other.tobytes()
    np.testing.assert_array_equal(pool.image(Step("load", code[0].args)), expected)


def test_overlapping_constant_loads_stay_apart():
    pool = ConstantPool()
    a = pool.add("a", np.arange(64, dtype=np.int8))
    group = ConstLoads([const_load(0, a, 64), const_load(32, a, 64)])
    assert len(pack_constants(pool, [group])[0].loads) == 2
    same_place = ConstLoads([const_load(0, a, 64), const_load(0, a, 32)])
    assert len(pack_constants(pool, [same_place])[0].loads) == 2


def test_in_const_resolves_to_the_current_slot():
    lowering = Lowering(SramPlan(1 << 16, const_slot=4096))
    tile = _tile()
    tile.compute.args["min"] = InConst(8)
    lowering.add_op(
        {"kind": "clamp"},
        [ConstLoads([const_load(0, 0, 64)]), tile, ConstLoads([const_load(0, 0, 64)]), _tile()],
    )
    code, _ = lowering.finish()
    assert next(i for i in code if i.op == "clamp").args["min"] == 8  # slot 0 at SRAM 0


def test_buffers_are_aligned_after_constants():
    plan = SramPlan(1 << 14)
    assert plan.buffers(100, 1000) == (128, 128 + 1024)
    slots = SramPlan(1 << 14, const_slot=2048)
    assert slots.buffers(100, 1000, scratch=10) == (4096 + 64, 4096 + 64 + 1024)
    assert not slots.fits(4096, 10)
    with pytest.raises(DoesNotFit):
        plan.buffers(0, 1 << 14)
    assert np.all(np.array(plan.buffers(0, 64)) % 64 == 0)


def test_a_grouped_convolution_whose_group_exceeds_sram_is_cut_inside_the_group(tmp_path):
    """Group 2, 32 output channels per group of 3x3x32 weights (10 KiB with their parameters) on an
    8 KiB SRAM: chunks of one group's channels, and the simulator still matches the golden
    interpreter bit for bit."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    from test_quantize import pipeline

    from npubuild.intmodel.interpreter import load_integer_model
    from npubuild.targets import npub
    from npubuild.targets.compile import compile_npub, plan_partition
    from npubuild.targets.runtime import Runtime
    from npubuild.targets.spec import BUILTIN_TARGETS

    rng = np.random.default_rng(3)
    w = (rng.standard_normal((64, 32, 3, 3)) * 0.1).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1], group=2)],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64, 6, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    model = onnx.shape_inference.infer_shapes(model)
    samples = rng.standard_normal((4, 64, 6, 6)).astype(np.float32)
    _, q, _, _ = pipeline(tmp_path, model, samples=samples)
    program, arrays, interpreter = load_integer_model(q["integer"])
    tiny = BUILTIN_TARGETS["vnpu-s"].model_copy(update={"sram_kib": 8})
    plan = plan_partition(program, arrays, model, tiny)
    assert plan["cpu_ops"] == 1 and plan["npu_ops"] == 1  # the network input's quantize, the conv
    data, listing, _ = compile_npub(program, arrays, model, tiny, plan)
    convs = [line for line in listing.splitlines() if " conv " in f" {line} " and "in_c=" in line]
    assert convs and all("group=1 " in line and "in_c=32 " in line for line in convs)
    widths = [int(line.split("out_c=")[1].split()[0]) for line in convs]
    assert max(widths) < 32 and sum(widths) % 64 == 0  # pieces of a group; every channel computed
    feed = {"x": samples[:1]}
    golden, _ = interpreter.run(feed)
    got = Runtime(npub.read(data)).run(feed)
    np.testing.assert_array_equal(got["y"], golden["y"])


def test_grouping_takes_the_least_dram_among_choices_within_one_percent_of_the_fastest(monkeypatch):
    """compile_npub's pick over its nine grouping choices and the refinements of each resident
    budget whose fastest is within REFINE_WITHIN of the fastest (finer constant slots, lifetime
    order, weight-bound ops' constants joining the group before): the fastest, unless another
    within DRAM_TIE of it moves fewer DRAM bytes (shufflenet on vnpu-m: +0.3% cycles, 2.2x ->
    1.7x)."""
    import npubuild.targets.compile as compile_module
    from npubuild.targets.spec import BUILTIN_TARGETS

    # (cycles, DRAM bytes) of each (resident share, constant-slot share) the search tries, then of
    # the fastest one's resident share with the slot shares halfway to its neighbours
    figures = iter([(1000, 900), (990, 800), (995, 500), (1001, 100), (1200, 50), *[(2000, 10)] * 4])
    # then budget 0's refinements (finer slots, joining), then budget 1/4's, whose fastest (1001)
    # is within 10% of 990 (a finer slot, lifetime order; no joining: its fastest has no slots);
    # budget 1/2's fastest (2000) is not refined
    figures = iter([*figures, (1100, 5), (994, 450), (1050, 300), (1300, 40), (1250, 30)])
    slot_shares, joins = [], []

    def fake(*args):
        if args[7].pin_tables:
            raise DoesNotFit  # as _compile says of a program with no table several ops read
        if args[7].in_place:  # the last refinement of each budget above 0: slower here
            stats = {"estimated_cycles": 1400, "dram_bytes": 20, "const_slot_bytes": 0, "stripes": []}
            return b"", {**stats, "resident_bytes": 0}
        slot_shares.append(args[7].const_share)
        joins.append(args[7].join_constants)
        cycles, dram = next(figures)
        stats = {"estimated_cycles": cycles, "dram_bytes": dram, "const_slot_bytes": 0, "stripes": []}
        return b"", {**stats, "resident_bytes": 0}

    monkeypatch.setattr(compile_module, "_compile", fake)
    # (the fake binaries are empty: the chosen one's listing is not read here)
    monkeypatch.setattr(compile_module.npub, "read", lambda data: None)
    monkeypatch.setattr(compile_module, "disassemble", lambda binary: "")
    monkeypatch.setattr(compile_module, "stripings", lambda *args: [])  # no chain to stripe here
    monkeypatch.setattr(compile_module, "_interval_choice", lambda *args: None)  # one budget throughout
    # one order (a chain has no lateral to move), and no model to read shapes from
    monkeypatch.setattr(compile_module, "model_shapes", lambda model: {})
    monkeypatch.setattr(compile_module, "early_reductions", lambda program, plan, nbytes: (program, plan))
    program, plan, _ = _chain(1)
    target = BUILTIN_TARGETS["vnpu-m"]
    _, _, stats = compile_module.compile_npub(program, {}, None, target, plan)
    # fastest 990 (slot share 1/8); within 1%: 1000, 990, 995, 994; the least DRAM of those: 994
    assert (stats["estimated_cycles"], stats["dram_bytes"]) == (994, 450)
    assert slot_shares[9:] == [0.0625, 0.1875, 0.125, 0.0625, 0.0]
    # budget 0's fastest (990, slot share 1/8) with constants joining
    assert joins == [False] * 11 + [True, False, False]
    rows = stats["grouping_search"]
    assert len(rows) == 15 and [r["residency"] for r in rows[12:14]] == ["definition", "lifetime"]
    assert rows[14]["in_place"] and rows[14]["resident_bytes"] > 0  # budget 1/4's best, in place


def test_shortest_lived_residents_claim_sram_first_when_asked():
    """Definition order lets a long-lived tensor hold the resident area that two short-lived ones,
    each read by the next op, could share one after the other; lifetime order keeps those two."""
    from npubuild.targets.backend.allocation import _place_resident

    first = {"long": 0, "b": 1, "c": 3}
    last = {"long": 10, "b": 2, "c": 4}
    sizes = {"long": 64 * 1024, "b": 64 * 1024, "c": 64 * 1024}
    budget = 100 * 1024
    by_definition = _place_resident(list(first), first, last, sizes, budget, "definition")
    by_lifetime = _place_resident(list(first), first, last, sizes, budget, "lifetime")
    assert {b.root for b in by_definition} == {"long"}
    assert {b.root for b in by_lifetime} == {"b", "c"}
    assert [b.start for b in by_lifetime] == [0, 0]  # c reuses b's bytes once b is dead


def test_the_schedule_checker_sees_a_constant_overwritten_while_a_tile_reads_it():
    """hazards.py counts the constants a compute reads (a table here; weights, parameters and index
    lists likewise): a constant load into a table's bytes while the LUT that reads it runs is
    reported, and waiting for that LUT mends it."""
    from npubuild.targets.hazards import hazards

    n = 16_000  # codes: the vector unit reads the table for 250 cycles
    box, strides = [1, 1, 1, n], [0, 0, 0, 1]
    source = Instruction("load", load(50_000, 0, 8, box, strides, [0] * 4).args, 0, T_IN[0])
    lut = {
        "src": 50_000,
        "n": n,
        "in_bits": 8,
        "table": 0,
        "offset": 128,
        "dst": 70_000,
        "out_bits": 8,
        "shift": 0,
    }
    table = {**const_load(0, 90_000, 256).args, "sram": 0}  # the constant area's first bytes
    target = BUILTIN_TARGETS["vnpu-m"].model_dump()
    for wait, found in ((0, True), (1 << T_DONE[0], False)):
        program = [
            Instruction("load", table, 0, T_CONST),
            source,
            Instruction("lut", lut, (1 << T_IN[0]) | (1 << T_CONST), T_DONE[0]),
            Instruction("load", {**table, "dram": 100_000}, wait, T_CONST),  # the next table
        ]
        reported = hazards(program, target, 1 << 18)
        assert any(h.startswith("#3 load writes [0, 256)") for h in reported) == found, reported
