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
