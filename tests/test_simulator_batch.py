"""A batch of images through the simulator computes, image for image, what each alone computes:
the same outputs and subgraph values, the same per-image counters; an instruction whose constants
a stream made differ between the images runs image by image and still agrees."""

from __future__ import annotations

import numpy as np
import pytest
from test_mappings import M, _conv

from npubuild.stages.simulate import balanced, batch_plan
from npubuild.targets.isa import MAPPINGS, Instruction
from npubuild.targets.runtime import Runtime, load
from npubuild.targets.sim_memory import Uneven
from npubuild.targets.simulator import Simulator


def test_a_batch_gives_each_image_what_it_gives_alone(cls_binary):
    alone = Runtime(load(cls_binary))
    batched = Runtime(load(cls_binary), batch=4)
    spec = alone.inputs[0]
    rng = np.random.default_rng(11)
    feeds = [{spec["name"]: rng.uniform(-1, 1, spec["shape"]).astype(np.float32)} for _ in range(3)]
    env: dict = {}
    got = batched.run_batch(feeds, env)  # 3 images in a runtime of 4: a smaller batch runs too
    counters = dict(batched.sim.counts)
    assert counters["macs"] > 0 and counters["dma_in_bytes"] > 0
    for image, feed in enumerate(feeds):
        alone.sim.counts.clear()
        one_env: dict = {}
        want = alone.run(feed, one_env)
        assert want.keys() == got[image].keys()
        for name in want:
            np.testing.assert_array_equal(got[image][name], want[name])
        for name, value in one_env.items():  # every subgraph's values, not only the outputs
            np.testing.assert_array_equal(env[name][image], value, err_msg=name)
        assert dict(alone.sim.counts) == counters  # counters are per image
    outputs = [next(iter(g.values())) for g in got]
    assert not np.array_equal(outputs[0], outputs[1])  # different images, different answers


def test_weights_that_differ_between_images_run_image_by_image():
    """A forged stream can leave other weights in each image's SRAM: the conv then runs once
    per image, each on its own weights, with the counters of one image."""
    rng = np.random.default_rng(5)
    a = {**_conv(in_c=16, out_c=8), "mapping": MAPPINGS["channels"]}
    xs = rng.integers(-128, 128, (3, 16 * 12 * 12)).astype(np.int8)
    ws = rng.integers(-128, 128, (3, 8 * 16 * 9)).astype(np.int8)
    params = np.array([[5, 1 << 30, 10]] * 8, np.int64).reshape(1, -1)
    program = [Instruction("conv", a), Instruction("end", {})]
    batch = Simulator(M["sram_kib"] * 1024, 1024, M, batch=3)
    batch.sram.write(a["src"], 8, xs)
    batch.sram.write(a["weights"], 8, ws)
    batch.sram.write(a["params"], 64, np.repeat(params, 3, axis=0))
    batch.execute(program)
    for image in range(3):
        one = Simulator(M["sram_kib"] * 1024, 1024, M)
        one.sram.write(a["src"], 8, xs[image][None])
        one.sram.write(a["weights"], 8, ws[image][None])
        one.sram.write(a["params"], 64, params)
        one.execute(program)
        want = one.sram.view(a["dst"], 8, (8 * 100,))[0]
        np.testing.assert_array_equal(batch.sram.view(a["dst"], 8, (8 * 100,))[image], want)
        assert np.unique(want).size > 10
        assert one.counts == batch.counts
    assert batch.sram.rows == 3 and batch.sram.first == 0  # the whole batch again afterwards


@pytest.mark.parametrize(
    ("count", "size", "want"), [(9, 8, [5, 4]), (16, 8, [8, 8]), (3, 8, [3]), (17, 8, [6, 6, 5]), (1, 1, [1])]
)
def test_batches_are_as_even_as_they_go(count, size, want):
    assert balanced(count, size) == want


@pytest.mark.parametrize(
    ("count", "size", "workers", "want"),
    [(9, 16, 2, ([9], 2)), (20, 16, 2, ([10, 10], 1)), (3, 1, 4, ([1, 1, 1], 1)), (16, 16, 1, ([16], 1))],
)
def test_one_batch_takes_every_core_and_several_take_a_thread_each(count, size, workers, want):
    assert batch_plan(count, size, workers) == want


def _copy(n: int, dram: int, sram: int, space: int = 0) -> dict:
    """A DMA of n bytes in one row: DRAM (or SRAM, space 1) at `dram` to SRAM at `sram`."""
    box = dict(d0=1, d1=1, d2=1, d3=n, s0=0, s1=0, s2=0, s3=1, pad_top=0, pad_bottom=0, pad_left=0)
    return dict(space=space, dram=dram, sram=sram, esize=1, **box, pad_right=0, pad_value=0)


def test_weights_copied_from_the_constants_are_known_until_something_writes_over_them():
    """A conv's weights loaded from the constants section carry a token naming their bytes (its
    session is found by it, without comparing the weights); weights written by anything else are
    compared, and a store over the constants makes later copies of them unknown. Each conv gives
    what a fresh simulator gives on the same weights."""
    rng = np.random.default_rng(9)
    a = {**_conv(in_c=16, out_c=8), "mapping": MAPPINGS["channels"]}
    n = 8 * 16 * 9
    constants, base = rng.integers(-128, 128, n).astype(np.int8), 4096
    xs = rng.integers(-128, 128, (2, 16 * 12 * 12)).astype(np.int8)
    params = np.array([[5, 1 << 30, 10]] * 8, np.int64).reshape(1, -1)
    sim = Simulator(M["sram_kib"] * 1024, 8192, M, batch=2)
    sim.dram.write(base, 8, np.repeat(constants[None], 2, axis=0))
    sim.dram.mark(base, base + n, "constants")
    sim.sram.write(a["src"], 8, xs)
    sim.sram.write(a["params"], 64, np.repeat(params, 2, axis=0))

    def conv_with(weights_from) -> np.ndarray:
        weights_from()
        sim.execute([Instruction("conv", a), Instruction("end", {})])
        return np.array(sim.sram.view(a["dst"], 8, (8 * 100,)))

    def alone(weights: np.ndarray) -> np.ndarray:
        one = Simulator(M["sram_kib"] * 1024, 1024, M, batch=2)
        one.sram.write(a["src"], 8, xs)
        one.sram.write(a["weights"], 8, np.repeat(weights[None], 2, axis=0))
        one.sram.write(a["params"], 64, np.repeat(params, 2, axis=0))
        one.execute([Instruction("conv", a), Instruction("end", {})])
        return np.array(one.sram.view(a["dst"], 8, (8 * 100,)))

    def load_constants():
        sim.execute([Instruction("load", _copy(n, base, a["weights"])), Instruction("end", {})])

    other = rng.integers(-128, 128, n).astype(np.int8)
    np.testing.assert_array_equal(conv_with(load_constants), alone(constants))
    named = sim.sram.same_in_every_row(a["weights"], 8, (n,))[1]
    assert named is not None
    np.testing.assert_array_equal(
        conv_with(lambda: sim.sram.write(a["weights"], 8, np.repeat(other[None], 2, axis=0))), alone(other)
    )
    assert sim.sram.same_in_every_row(a["weights"], 8, (n,))[1] is None
    np.testing.assert_array_equal(conv_with(load_constants), alone(constants))
    assert sim.sram.same_in_every_row(a["weights"], 8, (n,))[1] == named  # the same bytes, the same name
    # a store over the constants: the next copy of them is compared, and computes the new bytes
    scratch = a["dst"] + 8192
    sim.sram.write(scratch, 8, np.repeat(other[None], 2, axis=0))
    store = {k: v for k, v in _copy(n, base, scratch).items() if not k.startswith("pad")}
    sim.execute([Instruction("store", store), Instruction("end", {})])
    np.testing.assert_array_equal(conv_with(load_constants), alone(other))
    assert sim.sram.same_in_every_row(a["weights"], 8, (n,))[1] is None


def test_bytes_known_in_some_images_rows_are_not_known_in_the_others():
    """A copy made while one image's rows run says nothing of the other image's: read with both
    rows in use, the bytes are compared (and found to differ)."""
    sim = Simulator(64 * 1024, 8192, M, batch=2)
    sim.dram.write(0, 8, np.repeat(np.arange(64, dtype=np.int8)[None], 2, axis=0))
    sim.dram.mark(0, 64, "constants")
    sim.use_rows(0, 1)
    sim.execute([Instruction("load", _copy(64, 0, 1024)), Instruction("end", {})])
    assert sim.sram.same_in_every_row(1024, 8, (64,))[1] is not None  # known in image 0's rows
    sim.use_rows(0, 2)
    with pytest.raises(Uneven):  # image 1's SRAM never got the copy
        sim.sram.same_in_every_row(1024, 8, (64,))


def test_a_groups_weights_and_parameters_are_known_and_a_kept_rule_reads_its_own_copy():
    """A layer's constants arrive in one DMA (its weights, then its requantization parameters):
    each lies inside the known range and is read under a token, without comparing the images'
    rows. The output rule worked out for those parameters is kept by that token, so it must not
    read the SRAM it came from: loaded again elsewhere after the first place was written over, the
    same constants still compute what a fresh simulator computes."""
    rng = np.random.default_rng(13)
    n = 8 * 16 * 9
    weights = rng.integers(-128, 128, n).astype(np.int8)
    params = np.array([[5 * (c + 1), (1 << 30) + c, 9 + c % 3] for c in range(8)], np.int64)
    group = np.concatenate([weights, params.reshape(-1).view(np.int8)])  # n + 192 bytes, one DMA
    base = 4096
    xs = rng.integers(-128, 128, (2, 16 * 12 * 12)).astype(np.int8)
    sim = Simulator(M["sram_kib"] * 1024, 8192, M, batch=2)
    sim.dram.write(base, 8, np.repeat(group[None], 2, axis=0))
    sim.dram.mark(base, base + group.size, "constants")
    sim.sram.write(0, 8, xs)

    def conv_at(at: int) -> np.ndarray:
        a = {**_conv(in_c=16, out_c=8), "mapping": MAPPINGS["channels"], "weights": at, "params": at + n}
        sim.execute([Instruction("load", _copy(group.size, base, at)), Instruction("conv", a)])
        assert sim.sram.same_in_every_row(at, 8, (n,))[1] is not None
        assert sim.sram.same_in_every_row(at + n, 64, (8, 3))[1] is not None
        return np.array(sim.sram.view(a["dst"], 8, (8 * 100,)))

    one = Simulator(M["sram_kib"] * 1024, 1024, M, batch=2)
    a = {**_conv(in_c=16, out_c=8), "mapping": MAPPINGS["channels"]}
    one.sram.write(0, 8, xs)
    one.sram.write(a["weights"], 8, np.repeat(weights[None], 2, axis=0))
    one.sram.write(a["params"], 64, np.repeat(params.reshape(1, -1), 2, axis=0))
    one.execute([Instruction("conv", a), Instruction("end", {})])
    want = np.array(one.sram.view(a["dst"], 8, (8 * 100,)))
    np.testing.assert_array_equal(conv_at(4096), want)
    sim.sram.write(4096, 8, np.zeros((2, group.size), np.int8))  # the first place written over
    np.testing.assert_array_equal(conv_at(8192), want)
