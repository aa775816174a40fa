"""Import of old models: the onnx package's own backend test models (opset < 9, IR version 3,
initializers listed as graph inputs) upgrade to opset 13 and keep their weights as constants."""

from __future__ import annotations

import json
import os
from pathlib import Path

import onnx
import pytest

from npubuild.stages import importer
from npubuild.stages.onnx_utils import dims

LIGHT = Path(os.path.dirname(onnx.__file__)) / "backend" / "test" / "data" / "light"
MODELS = sorted(p.name for p in LIGHT.glob("light_*.onnx"))


def test_the_onnx_package_ships_the_nine_light_models():
    assert len(MODELS) == 9, MODELS


@pytest.mark.parametrize("name", MODELS)
def test_an_old_model_imports_at_opset_13(tmp_path, name):
    original = onnx.load(LIGHT / name)
    assert original.ir_version < 4 and min(o.version for o in original.opset_import if o.domain == "") < 13
    out = importer.run({"input_shapes": {}, "opset": 13}, {"model": LIGHT / name}, tmp_path)
    model = onnx.load(out["model"])
    summary = json.loads(Path(out["summary"]).read_text())
    assert summary["opset"] == 13 and summary["opset_before"] < 13
    initializers = {t.name for t in model.graph.initializer}
    inputs = [i.name for i in model.graph.input]
    assert inputs and not initializers & set(inputs)  # the weights are constants, not inputs
    assert all(d > 0 for d in dims(model.graph.output[0]))
