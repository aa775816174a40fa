"""What the stripe tests share (test_stripes, test_stripe_joins, test_stripe_pools, test_pinning):
the 512 KiB target, an int8 build of a small model planned for it, its stripings, and the check
that a binary computes the integer model's codes."""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import numpy as np
import onnx
from onnx import helper
from test_quantize import SETTINGS

from conftest import integer_variants
from npubuild.targets import npub
from npubuild.targets.backend.fusion import fuse
from npubuild.targets.backend.stripes import stripe
from npubuild.targets.compile import model_shapes, plan_partition
from npubuild.targets.runtime import Runtime
from npubuild.targets.spec import BUILTIN_TARGETS

# vnpu-m with a quarter of its SRAM: the test models' maps exceed it as real maps exceed 2 MiB
SMALL = BUILTIN_TARGETS["vnpu-m"].model_copy(update={"name": "vnpu-m-512k", "sram_kib": 512})


def squeeze_excite_tail(source: str, out: str) -> list[onnx.NodeProto]:
    """`out = source + source * HardSigmoid(Conv(GlobalAveragePool(source), wse))`: the tail PP-OCR
    det's feature pyramid puts on each level (nodes pool, excite, gate, gated and `out`)."""
    return [
        helper.make_node("GlobalAveragePool", [source], ["pool"], name="pool"),
        helper.make_node("Conv", ["pool", "wse"], ["se"], name="excite"),
        helper.make_node("HardSigmoid", ["se"], ["gate"], name="gate"),
        helper.make_node("Mul", [source, "gate"], ["gated"], name="gated"),
        helper.make_node("Add", [source, "gated"], [out], name=out),
    ]


class Built(NamedTuple):
    model: onnx.ModelProto
    program: object
    arrays: dict
    interpreter: object
    plan: dict


def build_int8(model: onnx.ModelProto, folder: Path, samples: np.ndarray, settings: dict = SETTINGS) -> Built:
    """The model quantized at `settings` (the quantize tests' int8 ones unless given) and
    partitioned for SMALL."""
    program, arrays, interpreter = integer_variants(model, folder, samples, {"v": settings})["v"]
    return Built(model, program, arrays, interpreter, plan_partition(program, arrays, model, SMALL))


def striping_of(built: Built, budget: int, **options):
    """stripes.stripe over the built model's fused program at `budget` resident bytes."""
    shapes = model_shapes(built.model)
    fused = fuse(built.program, built.plan, shapes)
    return stripe(built.program, built.arrays, shapes, built.plan, fused, budget, **options)


def assert_computes_the_codes(data: bytes, built: Built, runs: int = 2) -> None:
    """The binary's outputs equal the integer model's, every output, on `runs` random inputs."""
    (feed,) = built.model.graph.input
    shape = [d.dim_value for d in feed.type.tensor_type.shape.dim]
    runtime = Runtime(npub.read(data))
    rng = np.random.default_rng(5)
    for _ in range(runs):
        x = rng.normal(size=shape).astype(np.float32)
        got, want = runtime.run({feed.name: x}), built.interpreter.run({feed.name: x})[0]
        for y in built.model.graph.output:
            np.testing.assert_array_equal(got[y.name], want[y.name], err_msg=y.name)
