"""Upsamples read through (targets/backend/upsamples.py): a nearest Resize by whole factors that
only element-wise ops read moves nothing; its readers load its input with each element repeated,
and the binary still computes the integer model's codes."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper
from test_quantize import SETTINGS

import npubuild.targets.backend.allocation as allocation_module
from conftest import integer_variants, small_model
from npubuild.targets import npub
from npubuild.targets.compile import compile_npub, plan_partition
from npubuild.targets.hazards import binary_hazards
from npubuild.targets.runtime import Runtime
from npubuild.targets.spec import BUILTIN_TARGETS

SIZE = 32


def _model(rng: np.random.Generator, reader: str):
    """An FPN's top-down step: a stride-2 map upsampled 2x and added to (or multiplied with) the
    map it came from; with `reader` "concat" the upsample is concatenated instead."""
    weights = {
        "w0": rng.normal(size=(8, 3, 3, 3)) * 0.4,
        "w1": rng.normal(size=(8, 8, 3, 3)) * 0.2,
        "w2": rng.normal(size=(4, 16 if reader == "concat" else 8, 1, 1)) * 0.3,
        "scales": np.array([1, 1, 2, 2], np.float32),
    }
    join = {
        "add": helper.make_node("Add", ["a1", "u"], ["s"], name="join"),
        "mul": helper.make_node("Mul", ["u", "a1"], ["s"], name="join"),
        "concat": helper.make_node("Concat", ["a1", "u"], ["s"], axis=1, name="join"),
    }[reader]
    nodes = [
        helper.make_node("Conv", ["x", "w0"], ["a"], pads=[1, 1, 1, 1], name="conv0"),
        helper.make_node("Relu", ["a"], ["a1"], name="relu0"),
        helper.make_node("Conv", ["a1", "w1"], ["b"], pads=[1, 1, 1, 1], strides=[2, 2], name="down"),
        helper.make_node("Resize", ["b", "", "scales"], ["u"], mode="nearest", name="up"),
        join,
        helper.make_node("Conv", ["s", "w2"], ["y"], name="conv2"),
    ]
    return small_model(nodes, "fpn", {"x": [1, 3, SIZE, SIZE]}, {"y": [1, 4, SIZE, SIZE]}, weights)


@pytest.fixture(scope="module", params=["add", "mul", "concat"])
def built(request, tmp_path_factory):
    rng = np.random.default_rng(11)
    model = _model(rng, request.param)
    samples = rng.normal(size=(8, 3, SIZE, SIZE)).astype(np.float32)
    program, arrays, interpreter = integer_variants(
        model, tmp_path_factory.mktemp("upsamples"), samples, {"int8": SETTINGS}
    )["int8"]
    return request.param, model, program, arrays, interpreter


@pytest.mark.parametrize("target", ["vnpu-m", "vnpu-s"])
def test_an_upsample_an_elementwise_op_reads_moves_nothing(built, target, monkeypatch):
    reader, model, program, arrays, interpreter = built
    spec = BUILTIN_TARGETS[target]
    plan = plan_partition(program, arrays, model, spec)
    x = np.random.default_rng(2).normal(size=(1, 3, SIZE, SIZE)).astype(np.float32)
    want = interpreter.run({"x": x})[0]["y"]
    for grouped in (True, False):
        data, listing, stats = compile_npub(program, arrays, model, spec, plan, group=grouped)
        assert binary_hazards(data) == []
        np.testing.assert_array_equal(Runtime(npub.read(data)).run({"x": x})["y"], want)
        resizes = sum(" resize " in line for line in listing.splitlines())
        # read through by the add and the mul; a concatenation needs the upsampled bytes
        assert (resizes > 0) == (reader == "concat"), (reader, grouped)
        if reader == "concat":
            continue
        # the same model with the Resize run as an op: slower and more DRAM traffic
        with monkeypatch.context() as patch:
            patch.setattr(allocation_module, "upsample_views", lambda *args: {})
            _, listing_op, with_op = compile_npub(program, arrays, model, spec, plan, group=grouped)
        assert sum(" resize " in line for line in listing_op.splitlines()) >= 1
        assert stats["estimated_cycles"] < with_op["estimated_cycles"]
        assert stats["dram_bytes"] <= with_op["dram_bytes"]
