"""The constants section (targets/backend/context.py, ConstantPool): what the grouping search's
trial emissions leave behind after a rollback, and the bytes a constant load puts into SRAM."""

from __future__ import annotations

import numpy as np

from npubuild.targets.backend.commands import ConstLoads, InConst, const_load, load
from npubuild.targets.backend.constants import pack_constants
from npubuild.targets.backend.context import ConstantPool
from npubuild.targets.backend.memory import align


def test_a_strided_load_reads_its_box_in_sram_order():
    pool = ConstantPool(base=4096)
    matrix = np.arange(6 * 10, dtype=np.int16).reshape(6, 10)
    at = pool.add("m", matrix)
    # rows 1..4, columns 3..7 of the int16 matrix: a box of 4 x 5 elements, strides in elements
    box = load(InConst(0), at, 16, [1, 1, 4, 5], [0, 0, 10, 1], [0, 0, 1, 3])
    want = np.ascontiguousarray(matrix[1:5, 3:8]).view(np.uint8).reshape(-1)
    np.testing.assert_array_equal(pool.image(box), want)
    assert bytes(pool.data[: matrix.nbytes]) == matrix.tobytes()


def test_a_rolled_back_key_added_again_with_other_bytes_gets_them():
    pool = ConstantPool(base=0)
    pool.add("kept", np.arange(5, dtype=np.int8))
    mark = pool.mark()
    first = pool.add("trial", np.full(7, 1, np.int8))
    pool.rollback(mark)
    assert "trial" not in pool.keys and len(pool.data) == align(5)
    second = pool.add("trial", np.full(9, 2, np.int8))  # a resize's index list for other rows
    assert second == first == align(5)
    assert bytes(pool.data[second : second + 9]) == bytes([2] * 9)


def test_a_record_is_made_again_when_a_part_has_other_bytes_after_a_rollback():
    """Records are kept across trials by their parts' versions, never by key alone."""
    pool = ConstantPool(base=0)
    table = pool.add("table", np.arange(16, dtype=np.int8))

    def record(index: np.ndarray) -> bytes:
        at = pool.add("index", index)
        (load,) = pack_constants(pool, [ConstLoads([const_load(0, table, 16), const_load(16, at, 8)])])[
            0
        ].loads
        assert isinstance(load.args["sram"], InConst) and load.args["d3"] == 24
        return bytes(pool.data[load.args["dram"] : load.args["dram"] + 24])

    mark = pool.mark()
    first = record(np.full(8, 3, np.int8))
    pool.rollback(mark)
    again = record(np.full(8, 3, np.int8))  # the same bytes: the same record
    pool.rollback(mark)
    other = record(np.full(8, 4, np.int8))
    assert first == again == bytes(range(16)) + bytes([3] * 8)
    assert other == bytes(range(16)) + bytes([4] * 8)


def test_a_retaken_trial_leaves_the_pool_as_emitting_it_again_would():
    """choose_split keeps the chosen trial's commands and takes their constants back into the pool
    (`retake`) rather than emitting the split again: the pool must then be as that emission
    leaves it, whatever a later trial added and rolled back."""

    def trial(pool: ConstantPool, n: int) -> list[int]:  # a weight, and an index list per rows
        return [pool.add("weight", np.arange(6, dtype=np.int8)), pool.add("index", np.full(n, n, np.int8))]

    retaken, emitted = ConstantPool(base=64), ConstantPool(base=64)
    for pool in (retaken, emitted):
        pool.add("kept", np.arange(5, dtype=np.int8))
    mark = retaken.mark()
    chosen = trial(retaken, 3)
    taken = retaken.rollback(mark)
    trial(retaken, 11)  # another split's trial, not chosen
    retaken.rollback(mark)
    retaken.retake(taken)
    for n in (3, 11):
        trial(emitted, n)
        emitted.rollback(mark)
    assert trial(emitted, 3) == chosen
    assert retaken.keys == emitted.keys and bytes(retaken.data) == bytes(emitted.data)
    assert bytes(retaken.data[chosen[1] - 64 : chosen[1] - 64 + 3]) == bytes([3] * 3)
    later = [pool.add("next", np.ones(4, np.int8)) for pool in (retaken, emitted)]
    assert later[0] == later[1] and bytes(retaken.data) == bytes(emitted.data)
