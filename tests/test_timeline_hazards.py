"""The schedule checker (targets/hazards.py) and the waits it keeps honest: the simulator runs a
stream in order, so only the checker sees a wait that is missing, as a latency the hardware could
not reach. Lowering's own cases (ops reading and writing resident tensors in place, a Concat
whose inputs have tiles of their own sizes, an op's constants over the tiles of the op before),
then real binaries."""

from __future__ import annotations

import dataclasses

import pytest
from test_backend_phases import CLAMP, _tile

from npubuild.targets.backend.commands import ConstLoads, InTile, Step, Tile, const_load, load, store
from npubuild.targets.backend.lowering import T_DONE, T_STORED, Lowering
from npubuild.targets.backend.memory import SRAM_FLAG, SramPlan
from npubuild.targets.cycles import Timeline, end_cycle
from npubuild.targets.hazards import binary_hazards, hazards
from npubuild.targets.spec import BUILTIN_TARGETS

M = BUILTIN_TARGETS["vnpu-m"].model_dump()
SRAM = 1 << 16
BOTH_STORED = (1 << T_STORED[0]) | (1 << T_STORED[1])


def _lowered(*ops, const_slot: int = 0):
    lowering = Lowering(SramPlan(SRAM, const_slot))
    for commands in ops:
        lowering.add_op(CLAMP, commands)
    return lowering.finish()[0]


def test_the_checker_finds_a_wait_taken_away():
    code = _lowered([_tile() for _ in range(3)])
    assert hazards(code, M, SRAM) == []
    # the first tile's compute without its wait for the load: it reads the buffer being filled
    # (the second tile's load comes before it, into the other buffer)
    compute = code[2]
    assert compute.op == "clamp" and compute.wait >> 1 & 1  # token 1: input in buffer A
    code[2] = dataclasses.replace(compute, wait=0)
    found = hazards(code, M, SRAM)
    assert found and found[0].startswith("#2 clamp reads [1000, 1064) at 0, written until")
    # and the store without its wait for the compute: it copies out what is not yet written
    code = _lowered([_tile()])
    code[2] = dataclasses.replace(code[2], wait=0)
    assert hazards(code, M, SRAM)[0].startswith("#2 store reads [1064, 1128)")


def test_the_checker_finds_a_dram_read_before_its_store():
    """DRAM too: the second op loads the tensor the first stores to DRAM. Its tiles lie in other
    buffers, so without the first tile's wait nothing in SRAM overlaps and only the DRAM read of
    bytes still being stored is wrong."""
    first = _tile()
    second = _tile(buffers=(3000, 4000))
    second.loads[0].args["dram"] = 4096  # what the first op stores
    second.store.args["dram"] = 8192
    code = _lowered([first], [second])
    assert hazards(code, M, SRAM) == []
    load = next(k for k, i in enumerate(code) if i.op == "load" and i.args["dram"] == 4096)
    code[load] = dataclasses.replace(code[load], wait=0)
    found = hazards(code, M, SRAM)
    assert len(found) == 1 and found[0].startswith(f"#{load} load reads DRAM [4096, 4160) at ")
    # and a store over DRAM bytes a load still reads (a tensor's DRAM reused): the store's wait
    # for its compute taken away, it starts before the load of the same bytes has ended
    first = _tile(4000)
    first.store.args["dram"] = 0  # in place over its own input
    code = _lowered([first])
    assert hazards(code, M, SRAM) == []
    code[2] = dataclasses.replace(code[2], wait=0)
    assert any(h.startswith("#2 store writes DRAM [0, 4000) at 0") for h in hazards(code, M, SRAM))


def _resident_tile(n: int = 64) -> Tile:
    """One tile whose input and output are whole resident tensors (on-chip copies, `space` 1)."""
    box, strides = [1, 1, 1, n], [0, 0, 0, 1]
    compute = Step("clamp", {"src": InTile(), "n": n, "bits": 8, "min": 0, "max": 1, "dst": InTile(n)})
    return Tile(
        (1000, 2000),
        [load(InTile(), SRAM_FLAG + 40000, 8, box, strides, [0] * 4)],
        compute,
        store(InTile(n), SRAM_FLAG + 50000, 8, box, strides, [0] * 4),
    )


def test_an_op_of_one_tile_reads_and_writes_resident_tensors_in_place():
    code = _lowered([_tile()], [_resident_tile()], [_tile()])
    ops = [i.op for i in code]
    # the middle op is its compute alone, on the resident addresses
    assert ops == ["load", "clamp", "store", "clamp", "load", "clamp", "store", "end"]
    middle = code[3]
    assert (middle.args["src"], middle.args["dst"]) == (40000, 50000)
    # it waits for everything the op before wrote or stored; the op after waits for it
    assert middle.wait & BOTH_STORED == BOTH_STORED and middle.wait >> T_DONE[0] & 1
    assert code[4].wait >> T_DONE[0] & 1
    assert hazards(code, M, SRAM) == []


def test_an_op_of_several_tiles_reads_and_writes_resident_tensors_in_place():
    halves = [_resident_tile(), _resident_tile()]
    halves[1].loads[0].args["dram"] += 64  # each tile reads and writes its own 64 bytes
    halves[1].store.args["dram"] += 64
    code = _lowered([_tile()], halves, [_tile()])
    ops = [i.op for i in code]
    assert ops == ["load", "clamp", "store", "clamp", "clamp", "load", "clamp", "store", "end"]
    first, second = code[3], code[4]
    assert [(c.args["src"], c.args["dst"]) for c in (first, second)] == [(40000, 50000), (40064, 50064)]
    # the first waits for everything before the op, the second for the store that last used its
    # buffer (the op before's, here); the op after waits for both computes
    assert first.wait & BOTH_STORED == BOTH_STORED and second.wait >> T_STORED[1] & 1
    assert code[5].wait >> T_DONE[0] & 1 and code[5].wait >> T_DONE[1] & 1
    assert hazards(code, M, SRAM) == []
    # a tile that stores onto bytes the op reads: its tiles read copies
    onto = [_resident_tile(), _resident_tile()]
    onto[1].store.args["dram"] = 40000 + 32  # (space 1: an SRAM address)
    code = _lowered(onto)
    assert [i.op for i in code].count("load") == 2 and hazards(code, M, SRAM) == []


def test_a_padded_or_strided_copy_stays():
    padded = _resident_tile()
    padded.loads[0].args["pad_left"] = 1
    strided = _resident_tile()
    strided.loads[0].args["s3"] = 2
    for tile in (padded, strided):
        assert [i.op for i in _lowered([tile])] == ["load", "clamp", "end"]  # the store goes in place


def test_a_tile_in_other_buffers_waits_for_both_stores():
    """A Concat tiles each input its own way: its third tile may sit over the second's buffer."""
    wide = dataclasses.replace(_tile(200), buffers=(1000, 1300))
    code = _lowered([_tile(), _tile(), wide])
    third = code[6]
    assert third.op == "load" and third.wait & BOTH_STORED == BOTH_STORED
    assert hazards(code, M, SRAM) == []


def test_constants_wait_for_the_stores_of_the_tiles_they_land_on():
    """Without constant slots an op's constants start where the op before kept its tiles."""
    table = ConstLoads([const_load(1000, 0, 64)])
    code = _lowered([_tile()], [table, _tile()])
    constant = code[3]
    assert constant.op == "load" and constant.args["sram"] == 1000
    assert constant.wait & BOTH_STORED == BOTH_STORED
    assert hazards(code, M, SRAM) == []


def test_a_tile_that_stores_nothing_holds_its_buffer_until_its_compute_ends():
    """A global pool's tiles accumulate and only its last stores: the load of the tile after next
    into the same buffer waits for that tile's compute, as it would for a store (on vnpu-s the
    on-chip loads of PP-OCRv4 det's pools overwrote a tile its compute still read)."""
    tile = _tile(4000, buffers=(1000, 9000))  # large tiles: their loads take long
    code = _lowered([*[dataclasses.replace(tile, store=None)] * 4, tile])
    loads = [k for k, i in enumerate(code) if i.op == "load"]
    third = code[loads[2]]
    assert third.args["sram"] == code[loads[0]].args["sram"]  # buffer A again
    assert third.wait >> T_DONE[0] & 1
    assert hazards(code, M, SRAM) == []


@pytest.mark.parametrize("target_name", ["vnpu-m", "vnpu-s"])
def test_real_binaries_have_no_hazard(cls_binary, target_name):
    """The PP-OCR classifier, grouped (resident tensors, in place where they can be) and layer by
    layer, on both targets."""
    import onnx

    from npubuild.intmodel.interpreter import load_integer_model
    from npubuild.targets.compile import compile_npub, plan_partition

    out = cls_binary.parent
    model = onnx.load(out / "optimized.onnx")
    program, arrays, _ = load_integer_model(out / "quantized.npq")
    target = BUILTIN_TARGETS[target_name]
    plan = plan_partition(program, arrays, model, target)
    for group in (True, False):
        data, _, stats = compile_npub(program, arrays, model, target, plan, group=group)
        assert binary_hazards(data) == [], (target_name, group)
    assert stats["instructions"] > 100


def test_the_timelines_memo_of_each_instruction_answers_only_for_the_target_and_wait_it_saw():
    """cycles.Timeline keeps each instruction's engine, cost and waits on it, keyed by the
    target: a target changed in place, and an instruction whose wait was replaced, are timed
    as fresh instructions (nothing memoised) are."""

    def fresh(code):
        return [dataclasses.replace(i) for i in code]  # `timing` is not copied

    code = _lowered([_tile() for _ in range(3)])
    target = dict(M)
    first = end_cycle(code, target)
    target["dram_latency_cycles"] *= 4
    slower = end_cycle(code, target)
    assert slower == end_cycle(fresh(code), target) > first
    target["dram_latency_cycles"] //= 4
    assert end_cycle(code, target) == first
    # the first tile's compute no longer waits for its input: it starts at 0
    compute = dataclasses.replace(code[2], wait=0)
    timeline = Timeline(target)
    timeline.run(code[:2])
    assert timeline.add(compute)[0] == 0 < Timeline(target).run(code[:3])[0]
