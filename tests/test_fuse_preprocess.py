"""fuse_preprocess (issue 18, part 2): the declared preprocessing folded into the model, so the NPU
takes uint8 pixels and no float conversion runs on the CPU."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest

from conftest import DATA_BUILD, MODELS_BUILD, PHOTOS, cli, make_small_ws, write
from npubuild.intmodel.interpreter import load_integer_model
from npubuild.rules.attrs import Preprocess
from npubuild.stages import prepare
from npubuild.stages.feeds import session
from npubuild.stages.fuse import fuse
from npubuild.targets.npub import read
from npubuild.targets.runtime import Runtime

PHOTO = PHOTOS / "calib" / "coffee.jpg"


@pytest.mark.parametrize(
    "declared",
    [
        {"resize": [48, 192], "color": "BGR", "mean": [0.5], "std": [0.5]},
        {"resize": [48, 192], "color": "RGB", "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]},
    ],
)
def test_the_head_computes_the_declared_preprocessing(cls_model, declared):
    """The fused model on the photo's pixels gives what the original model gives on the photo as
    the data set preprocesses it (onnxruntime both)."""
    pp = Preprocess(**declared)
    model = onnx.load(cls_model)
    normalised = prepare._image(PHOTO, "coffee.jpg", pp.model_dump())[None]
    pixels = prepare._image(PHOTO, "coffee.jpg", pp.pixels().model_dump())[None]
    assert pixels.dtype == np.float32 and pixels.min() >= 0 and pixels.max() <= 255
    assert np.array_equal(pixels, np.round(pixels))  # whole pixel values
    want = session(model).run(None, {"x": normalised})[0]
    got = session(fuse(model, pp.model_dump())).run(None, {"x": pixels})[0]
    assert np.allclose(got, want, atol=2e-5), np.abs(got - want).max()


FUSED_BUILD = MODELS_BUILD.replace(
    'optimize = {"check_samples": 2},\n)',
    'optimize = {"check_samples": 2},\n)\n\n'
    'npu_model(\n    name = "fused",\n    model = ":cls",\n    calibration = "//data:calib",\n'
    '    evaluation = "//data:eval",\n    fuse_preprocess = True,\n)',
)


def test_a_fused_model_takes_uint8_pixels_on_the_npu(tmp_path, cls_model):
    ws = make_small_ws(tmp_path / "ws", cls_model)
    write(ws / "models" / "BUILD", FUSED_BUILD)
    result = cli(["build", "//models:cls_npu", "//models:fused"], ws, tmp_path / "cache")
    assert result.returncode == 0, result.stdout + result.stderr
    out = ws / "npubuild-out" / "models"
    meta = read((out / "fused" / "model.npub").read_bytes()).meta
    assert meta["inputs"] == [{"name": "x", "shape": [1, 3, 48, 192], "dtype": "uint8", "pixels": True}]
    # no float-to-integer conversion: the first subgraph is the NPU's, reading the input itself
    first = meta["subgraphs"][0]
    assert first["device"] == "npu" and first["inputs"][0]["name"] == "x"
    unfused = read((out / "cls_npu" / "model.npub").read_bytes()).meta
    # ...where the unfused model's first subgraph is the CPU's quantize of x
    assert unfused["subgraphs"][0]["device"] == "cpu" and unfused["subgraphs"][0]["ops"] == ["x"]
    assert json.loads((out / "fused" / "simulate.json").read_text())["bit_exact"]["mismatches"] == []

    # The binary on a photo's bytes computes what the integer model computes on its pixel values.
    pp = Preprocess(**{"resize": [48, 192], "color": "BGR", "mean": [0.5], "std": [0.5]})
    photo = ws / "data" / "eval" / "camera.png"
    pixels = prepare._image(photo, "camera.png", pp.pixels().model_dump())[None]
    got = Runtime(read((out / "fused" / "model.npub").read_bytes())).run({"x": pixels.astype(np.uint8)})
    _, _, interpreter = load_integer_model(out / "fused" / "quantized.npq")
    want, _ = interpreter.run({"x": pixels})
    for name, value in want.items():
        assert np.array_equal(got[name], value), name
    # `npubuild run --image` hands the binary the same bytes
    ran = cli(
        ["run", "//models:fused", "--image", str(photo), "-o", str(tmp_path / "o")], ws, tmp_path / "cache"
    )
    assert ran.returncode == 0, ran.stderr
    (written,) = list((tmp_path / "o").glob("*.npy"))
    (expected,) = got.values()
    np.testing.assert_array_equal(np.load(written), expected)
    with pytest.raises(Exception, match="uint8"):
        Runtime(read((out / "fused" / "model.npub").read_bytes())).run({"x": pixels / 255})

    # accuracy against the float model as good as the unfused build's (same photos)
    def cosine(name: str) -> float:
        report = json.loads((out / name / "accuracy.json").read_text())
        return min(o["cosine"] for o in report["outputs"].values())

    assert cosine("fused") > cosine("cls_npu") - 0.005


@pytest.mark.parametrize(
    "data, message",
    [
        (
            DATA_BUILD.replace('glob(["eval/*.png"])', '["eval/t.npy"]'),
            "fuse_preprocess: data set //data:eval is not photographs only",
        ),
        (
            DATA_BUILD.replace('glob(["eval/*.png"]), preprocess = PRE', 'glob(["eval/*.png"])'),
            "declare different preprocessing; the model can fold only one",
        ),
        (
            DATA_BUILD.replace('"mean": [0.5]', '"dtype": "uint8", "mean": [0.5]'),
            "gives uint8 pixels; the preprocessing to fold is a float one",
        ),
    ],
)
def test_what_cannot_be_fused_is_one_line_at_the_attribute(tmp_path, cls_model, data, message):
    ws = make_small_ws(tmp_path / "ws", cls_model)
    write(ws / "models" / "BUILD", FUSED_BUILD)
    write(ws / "data" / "BUILD", data)
    np.save(ws / "data" / "eval" / "t.npy", np.zeros((1, 3, 48, 192), np.float32))
    result = cli(["build", "//models:fused"], ws, tmp_path / "cache")
    assert result.returncode != 0 and "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if "error" in line]
    assert len(lines) == 1 and message in lines[0], result.stderr
    line = next(i for i, t in enumerate(FUSED_BUILD.splitlines(), 1) if "fuse_preprocess" in t)
    assert f"{Path('models') / 'BUILD'}:{line}" in lines[0]


def test_a_binary_that_declares_non_byte_pixels_is_refused():
    """A forged .npub metadata: a pixels input must be uint8 (the input DMA flips bytes)."""
    from pydantic import ValidationError

    from npubuild.targets.meta import InputSpec

    with pytest.raises(ValidationError, match="a pixels input is uint8"):
        InputSpec.model_validate({"name": "x", "shape": [1, 3, 8, 8], "dtype": "float32", "pixels": True})
    assert InputSpec.model_validate(
        {"name": "x", "shape": [1, 3, 8, 8], "dtype": "uint8", "pixels": True}
    ).pixels
