"""Tables pinned early (lowering.py `_early_anchors`, pinning.py `every`): a 16-bit lookup table
that one op reads, after a short layer that cannot hide its load, loads into SRAM of its own
while a convolution several ops earlier computes (as Silero VAD's square root after its STFT).
Pinned, it waits for nothing and takes no turn of the constant slots; the stream keeps its waits
(hazards), computes the integer model's codes, and is estimated faster by about the load."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper
from test_quantize import SETTINGS

from conftest import integer_variants, npu_instructions, small_model
from npubuild.targets import npub
from npubuild.targets.compile import Grouping, _compile, compile_npub, plan_partition
from npubuild.targets.hazards import binary_hazards
from npubuild.targets.runtime import Runtime
from npubuild.targets.spec import BUILTIN_TARGETS

TARGET = BUILTIN_TARGETS["vnpu-m"]
TABLE = 2**16  # the HardSwish of a 16-bit result: 65,536 entries of 8 bits


def _model(rng: np.random.Generator):
    weights = {
        "w1": rng.normal(size=(64, 64, 3, 3)) * 0.05,
        "w2": rng.normal(size=(16, 64, 1, 1)) * 0.15,
        "w3": rng.normal(size=(16, 16, 1, 1)) * 0.2,
        "w4": rng.normal(size=(32, 16, 3, 3)) * 0.1,
    }
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1], name="stem"),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], strides=[2, 2], name="narrow"),
        helper.make_node("Conv", ["c2", "w3"], ["c3"], name="wide16"),
        helper.make_node("HardSwish", ["c3"], ["h"], name="hswish"),
        helper.make_node("Conv", ["h", "w4"], ["y"], pads=[1, 1, 1, 1], name="head"),
    ]
    return small_model(nodes, "early", {"x": [1, 64, 32, 32]}, {"y": [1, 32, 16, 16]}, weights)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    rng = np.random.default_rng(41)
    model = _model(rng)
    samples = rng.normal(size=(6, 64, 32, 32)).astype(np.float32)
    # wide16's result at 16 bits, so that its HardSwish is a lookup-table op with a 64 KiB table
    settings = {**SETTINGS, "overrides": [{"match": "wide16", "bits": 16}]}
    program, arrays, interpreter = integer_variants(
        model, tmp_path_factory.mktemp("early"), samples, {"wide": settings}
    )["wide"]
    plan = plan_partition(program, arrays, model, TARGET)
    return model, program, arrays, interpreter, plan


def _compiled(built, pin: str):
    model, program, arrays, _, plan = built
    return _compile(
        program, arrays, model, TARGET, plan, True, True, Grouping(512 * 1024, 0.125, pin_tables=pin)
    )


def _starts(data: bytes) -> tuple[int, list[int], list]:
    """The index of the table's load, those of the convolutions, and the instructions."""
    code = npu_instructions(npub.read(data))
    (table,) = [k for k, i in enumerate(code) if i.op == "load" and i.args["d3"] == TABLE]
    convs = [k for k, i in enumerate(code) if i.op == "conv"]
    return table, convs, code


def test_a_table_one_op_reads_loads_early_when_pinned(built):
    *_, interpreter, _ = built
    plain, every = _compiled(built, ""), _compiled(built, "every")
    assert every[1]["pinned_tables"] >= 1
    table, convs, code = _starts(every[0])
    assert code[table].wait == 0  # its own SRAM: nothing to wait for
    # loaded before the two narrow layers before its reader compute, i.e. while the stem computes
    narrow = [k for k in convs if code[k].args["out_c"] == 16]
    assert table < narrow[0], (table, narrow)
    plain_table, plain_convs, plain_code = _starts(plain[0])
    assert plain_table > [k for k in plain_convs if plain_code[k].args["out_c"] == 16][0]
    # 64 KiB at 32 bytes per cycle: about 2,000 cycles the vector unit waited for, unpinned
    assert every[1]["estimated_cycles"] < plain[1]["estimated_cycles"] - 1000, (
        every[1]["estimated_cycles"],
        plain[1]["estimated_cycles"],
    )
    rng = np.random.default_rng(5)
    for data, _ in (plain, every):
        assert binary_hazards(data) == []
        runtime = Runtime(npub.read(data))
        for _ in range(2):
            x = rng.normal(size=(1, 64, 32, 32)).astype(np.float32)
            np.testing.assert_array_equal(runtime.run({"x": x})["y"], interpreter.run({"x": x})[0]["y"])


def test_the_grouping_search_tries_every_table_pinned(built):
    model, program, arrays, _, plan = built
    _, _, stats = compile_npub(program, arrays, model, TARGET, plan)
    rows = [r for r in stats["grouping_search"] if "pinned_tables" in r]
    # no table here has two readers, so the shared choice compiles nothing: every row pins all
    assert rows and all(r["pinned_tables"] == 1 for r in rows)
    assert stats["estimated_cycles"] <= min(r["estimated_cycles"] for r in rows)
