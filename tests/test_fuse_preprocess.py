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


def test_a_fused_model_takes_uint8_pixels_on_the_npu(tmp_path, cls_model, warm_cache):
    # the small workspace's build is in warm_cache: cls_npu, the unfused twin, comes from it
    ws = make_small_ws(tmp_path / "ws", cls_model)
    write(ws / "models" / "BUILD", FUSED_BUILD)
    result = cli(["build", "//models:cls_npu", "//models:fused"], ws, warm_cache)
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
    ran = cli(["run", "//models:fused", "--image", str(photo), "-o", str(tmp_path / "o")], ws, warm_cache)
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


def _one_conv(pads: list[int], shared_weight: bool = False) -> onnx.ModelProto:
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(3)
    w = numpy_helper.from_array(rng.normal(size=(4, 3, 3, 3)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.normal(size=4).astype(np.float32), "b")
    cut = [numpy_helper.from_array(np.array([v]), n) for v, n in ((0, "s0"), (3, "s1"), (1, "ax"))]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["y"], pads=pads, name="conv")]
    if shared_weight:  # the same weight read by a convolution of the first one's first channels
        nodes.append(helper.make_node("Slice", ["y", "s0", "s1", "ax"], ["y3"]))
        nodes.append(helper.make_node("Conv", ["y3", "w"], ["z"], pads=[1, 1, 1, 1], name="other"))
    graph = helper.make_graph(
        nodes,
        "one",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("z" if shared_weight else "y", TensorProto.FLOAT, None)],
        [w, b, *cut],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize(
    "declared, pads, folded",
    [
        # no mean: a zero pixel is a zero input, so the padding is the same: folded
        ({"color": "BGR", "scale": 1 / 255, "mean": [0.0], "std": [1.0]}, [1, 1, 1, 1], True),
        # a mean and no padding: folded, the mean through the weights into the bias
        ({"color": "RGB", "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}, [0, 0, 0, 0], True),
        # a mean and padding: the padded zeros are not a pixel value, so the head stays
        ({"color": "RGB", "mean": [0.5], "std": [0.5]}, [1, 1, 1, 1], False),
    ],
)
def test_the_head_folds_into_the_first_convolution_where_that_is_exact(declared, pads, folded):
    from npubuild.stages.quantize.graphinfo import FUSED_HEAD

    pp = Preprocess(**{"resize": [8, 8], **declared}).model_dump()
    model = _one_conv(pads)
    fused = fuse(model, pp)
    assert any(n.name == FUSED_HEAD for n in fused.graph.node) is not folded
    pixels = np.random.default_rng(5).integers(0, 256, size=(1, 3, 8, 8)).astype(np.float32)
    mean = np.broadcast_to(np.asarray(pp["mean"], np.float32), (3,))[None, :, None, None]
    std = np.broadcast_to(np.asarray(pp["std"], np.float32), (3,))[None, :, None, None]
    source = pixels[:, ::-1] if pp["color"] == "BGR" else pixels
    normalised = ((source * pp["scale"] - mean) / std).astype(np.float32)
    want = session(model).run(None, {"x": normalised})[0]
    got = session(fused).run(None, {"x": pixels})[0]
    assert np.allclose(got, want, atol=1e-4 * np.abs(want).max()), np.abs(got - want).max()


def test_a_weight_another_convolution_reads_is_not_folded_into():
    from npubuild.stages.quantize.graphinfo import FUSED_HEAD

    pp = Preprocess(**{"resize": [8, 8], "scale": 1 / 255, "mean": [0.0], "std": [1.0]}).model_dump()
    fused = fuse(_one_conv([1, 1, 1, 1], shared_weight=True), pp)
    assert any(n.name == FUSED_HEAD for n in fused.graph.node)
