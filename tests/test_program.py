"""The typed integer model (intmodel/program.py): a quantized.npq header is validated on load, and
a malformed one is one clear error naming where, never a crash later in a stage."""

from __future__ import annotations

import numpy as np
import pytest

from npubuild.errors import UserError
from npubuild.intmodel import tensorfile
from npubuild.intmodel.interpreter import load_integer_model
from npubuild.intmodel.program import ClampOp, IntegerModel, parse

GOOD = {
    "version": 1,
    "inputs": ["x"],
    "outputs": ["y"],
    "ops": [
        {"kind": "quantize", "inputs": ["x"], "outputs": ["x"]},
        {"kind": "clamp", "node": "relu", "inputs": ["x"], "outputs": ["y"], "attrs": {"min": 0, "max": 127}},
    ],
    "tensors": {n: {"scale": 0.5, "zero_point": 0, "bits": 8} for n in "xy"},
    "opset": 13,
}


def test_a_valid_header_is_typed():
    model = parse(GOOD, "here")
    assert isinstance(model, IntegerModel) and isinstance(model.ops[1], ClampOp)
    assert model.ops[1].attrs.max == 127 and model.ops[0].label == "x" and model.ops[1].label == "relu"
    assert model.tensors["y"].model_dump() == {"scale": 0.5, "zero_point": 0, "bits": 8, "channel_shifts": ()}


@pytest.mark.parametrize(
    "change, where",
    [
        (lambda m: m["ops"][1].update(kind="teleport"), "ops.1"),
        (lambda m: m["ops"][1]["attrs"].pop("max"), "ops.1.clamp.attrs.max"),
        (lambda m: m["tensors"]["y"].update(scale=-1.0), "tensors.y.scale"),
        (lambda m: m["tensors"]["y"].update(bits=12), "tensors.y.bits"),
        (lambda m: m["ops"][1].update(extra="?"), "ops.1.clamp.extra"),
        (lambda m: m["tensors"]["y"].update(bits=16, channel_shifts=[1, 2]), "tensors.y"),
        (lambda m: m["tensors"]["y"].update(channel_shifts=[99]), "tensors.y.channel_shifts.0"),
    ],
    ids=[
        "unknown-kind",
        "missing-attr",
        "negative-scale",
        "odd-width",
        "unknown-field",
        "wide-channel-grid",
        "shift-out-of-range",
    ],  # fmt: skip
)
def test_a_malformed_header_is_one_error_naming_where(tmp_path, change, where):
    import copy

    meta = copy.deepcopy(GOOD)
    change(meta)
    path = tmp_path / "quantized.npq"
    tensorfile.save(path, {"a": np.zeros(1, np.int8)}, meta)
    with pytest.raises(UserError) as error:
        load_integer_model(path)
    message = str(error.value)
    assert "\n" not in message and str(path) in message and where in message, message
