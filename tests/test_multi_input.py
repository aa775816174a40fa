"""Data sets that are not one image (issue 15, part 6): .npz files with one array per input name
feed a model with several inputs, one of them integer token ids; .npy stacks of any rank."""

from __future__ import annotations

import io
import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from PIL import Image

from conftest import PHOTOS, cli, write
from npubuild.errors import UserError
from npubuild.stages import prepare
from npubuild.stages.feeds import iterate_feeds, samples_for

RNG = np.random.default_rng(5)


def _model() -> onnx.ModelProto:
    """x (an image) through a convolution, scaled by `gain`, plus an embedding row picked by `ids`."""
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("Mul", ["r", "gain"], ["m"]),
        helper.make_node("Gather", ["table", "ids"], ["row"], axis=0),
        helper.make_node("Reshape", ["row", "shape"], ["bias"]),
        helper.make_node("Add", ["m", "bias"], ["y"]),
    ]
    inits = {
        "w": (RNG.standard_normal((8, 3, 3, 3)) * 0.3).astype(np.float32),
        "b": (RNG.standard_normal(8) * 0.1).astype(np.float32),
        "table": RNG.standard_normal((10, 8)).astype(np.float32),
        "shape": np.array([1, 8, 1, 1], np.int64),
    }
    graph = helper.make_graph(
        nodes,
        "g",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16]),
            helper.make_tensor_value_info("gain", TensorProto.FLOAT, [1, 8, 1, 1]),
            helper.make_tensor_value_info("ids", TensorProto.INT64, [1]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 16, 16])],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def _crops(role: str) -> list[np.ndarray]:
    """16x16 crops of the example's real photographs, RGB in 0..1, NCHW."""
    crops = []
    for path in sorted((PHOTOS / role).glob("*.jpg")):
        pixels = np.asarray(Image.open(path).convert("RGB").resize((32, 32)), np.float32) / 255
        crops += [pixels[:16, :16], pixels[16:, 16:]]
    return [c.transpose(2, 0, 1)[None].copy() for c in crops]


def _feed_file(path, x: np.ndarray, k: int, ids_dtype=np.int32) -> None:
    gain = np.full((1, 8, 1, 1), 0.5 + 0.1 * (k % 5), np.float32)
    # token ids saved as int32 for an int64 input: the feed converts them, no value changes
    np.savez(path, x=x, gain=gain, ids=np.array([k % 10], ids_dtype))


MODELS = """\
onnx_model(name = "three", src = "three.onnx")

npu_model(
    name = "three_npu",
    model = ":three",
    calibration = "//data:calib",
    evaluation = "//data:eval",
    target = "vnpu-m",
    optimize = {"check_samples": 2},
)
"""

DATA = """\
dataset(name = "calib", srcs = glob(["calib/*.npz"]))
dataset(name = "eval", srcs = glob(["eval/*.npz"]))
"""


def test_a_model_with_three_inputs_builds_from_named_npz_feeds(tmp_path):
    ws = tmp_path / "ws"
    write(ws / "WORKSPACE", "")
    write(ws / "models" / "BUILD", MODELS)
    onnx.save(_model(), ws / "models" / "three.onnx")
    write(ws / "data" / "BUILD", DATA)
    for role in ("calib", "eval"):
        (ws / "data" / role).mkdir()
        for k, x in enumerate(_crops(role)):
            _feed_file(ws / "data" / role / f"{k:02d}.npz", x, k)
    done = cli(["build", "//models:three_npu"], ws, tmp_path / "cache")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = ws / "npubuild-out" / "models" / "three_npu"
    accuracy = json.loads((out / "accuracy.json").read_text())
    assert accuracy["samples"] == 4 and accuracy["outputs"]["y"]["cosine"] >= 0.99, accuracy["outputs"]
    # the QDQ export is measured against the integer model on every output, and says so
    assert accuracy["golden_vs_qdq"]["outputs"]["y"]["cosine"] >= 0.999
    assert not [w for w in accuracy["warnings"] if "QDQ export" in w]
    (row,) = [ln for ln in done.stdout.splitlines() if ln.startswith("//models:three_npu")]
    assert f"  cos {accuracy['golden_vs_qdq']['outputs']['y']['cosine']:.4f}" in row, row  # its own column
    simulation = json.loads((out / "simulate.json").read_text())
    assert simulation["bit_exact"]["ok"] and simulation["bit_exact"]["elements"] > 0
    assert simulation["end_to_end"]["y"]["vs_integer_model"]["max_abs_error"] == 0.0
    # the embedding lookup of the integer ids runs on the CPU, and says so
    fallbacks = json.loads((out / "partition.json").read_text())["fallbacks"]
    assert {
        "kind": "float",
        "node": "row",
        "reason": "Gather stays float: no integer rule for Gather",
    } in fallbacks
    # the binary runs with one file per input, the way a user feeds it
    feed = np.load(ws / "data" / "eval" / "00.npz")
    args = []
    for name in ("x", "gain", "ids"):
        np.save(tmp_path / f"{name}.npy", feed[name].astype(np.int64) if name == "ids" else feed[name])
        args += ["--input", f"{name}={tmp_path / f'{name}.npy'}"]
    ran = cli(["run", "//models:three_npu", *args, "-o", str(tmp_path / "o")], ws, tmp_path / "cache")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert np.load(tmp_path / "o" / "y.npy").shape == (1, 8, 16, 16)


def _prepare(tmp_path, files: dict[str, bytes], dtype: str = "float32"):
    names = sorted(files)
    inputs = {}
    for i, name in enumerate(names):
        inputs[f"src/{i:05d}"] = tmp_path / f"in{i}"
        inputs[f"src/{i:05d}"].write_bytes(files[name])
    pp = {"resize": None, "layout": "NCHW", "color": "RGB", "scale": 1.0, "mean": [0.0], "std": [1.0]}
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    result = prepare.run({"files": names, "preprocess": {**pp, "dtype": dtype}, "limit": None}, inputs, out)
    return np.load(result["tensors"]), json.loads(result["summary"].read_text())


def _npz(**arrays) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def test_named_npz_files_become_one_record_per_feed_with_their_own_dtypes(tmp_path):
    x = RNG.standard_normal((2, 1, 3, 16, 16)).astype(np.float32)
    files = {f"{k}.npz": _npz(x=x[k], ids=np.array([k + 3], np.int64)) for k in range(2)}
    records, summary = _prepare(tmp_path, files)
    assert records.dtype.names == ("ids", "x") and len(records) == 2
    assert records["ids"].dtype == np.int64 and records["x"].shape == (2, 1, 3, 16, 16)
    np.testing.assert_array_equal(records["x"][1], x[1])
    assert summary["inputs"] == {"ids": ["int64", [1]], "x": ["float32", [1, 3, 16, 16]]}
    feeds = samples_for(_model(), _with_gain(records), 8)
    assert [int(f["ids"][0]) for f in feeds] == [3, 4]
    assert feeds[0]["x"].shape == (1, 3, 16, 16) and feeds[0]["gain"].shape == (1, 8, 1, 1)
    assert [int(f["ids"][0]) for f in iterate_feeds(_model(), _with_gain(records), 1)] == [3]


def _with_gain(records: np.ndarray) -> np.ndarray:
    """The records plus a gain field (the prepared files above give only x and ids)."""
    dtype = [*[(n, records.dtype[n].base, records.dtype[n].shape) for n in records.dtype.names]]
    out = np.zeros(len(records), dtype=[*dtype, ("gain", np.float32, (1, 8, 1, 1))])
    for n in records.dtype.names:
        out[n] = records[n]
    out["gain"] = 1.0
    return out


def test_feeds_name_what_is_missing_extra_or_of_the_wrong_kind(tmp_path):
    x = RNG.standard_normal((1, 3, 16, 16)).astype(np.float32)
    records, _ = _prepare(tmp_path, {"a.npz": _npz(x=x, ids=np.array([1], np.int64))})
    with pytest.raises(UserError, match=r"also needs input\(s\) \['gain'\]"):
        samples_for(_model(), records, 1)
    full = _with_gain(records)
    extra = np.zeros(
        1,
        dtype=[*[(n, full.dtype[n].base, full.dtype[n].shape) for n in full.dtype.names], ("mask", np.int8)],
    )
    for n in full.dtype.names:
        extra[n] = full[n]
    with pytest.raises(UserError, match=r"\['mask'\], which the model has no input for"):
        samples_for(_model(), extra, 1)
    floats = np.zeros(
        1,
        dtype=[
            ("x", np.float32, (1, 3, 16, 16)),
            ("gain", np.float32, (1, 8, 1, 1)),
            ("ids", np.float32, (1,)),
        ],
    )
    with pytest.raises(UserError, match="'ids' is float32, but model input 'ids' is int64"):
        samples_for(_model(), floats, 1)
    big = np.zeros(
        1,
        dtype=[
            ("x", np.float32, (1, 3, 16, 16)),
            ("gain", np.float32, (1, 8, 1, 1)),
            ("ids", np.uint64, (1,)),
        ],
    )
    big["ids"] = 2**63 + 5
    with pytest.raises(UserError, match="values would change"):
        samples_for(_model(), big, 1)


def test_data_set_files_must_agree(tmp_path):
    x = RNG.standard_normal((1, 3, 16, 16)).astype(np.float32)
    with pytest.raises(UserError, match="b.npz: its arrays differ from a.npz's"):
        _prepare(tmp_path, {"a.npz": _npz(x=x, ids=np.array([1])), "b.npz": _npz(x=x, mask=np.array([1]))})
    buf = io.BytesIO()
    np.save(buf, x)
    with pytest.raises(UserError, match="either named .npz feeds or tensors and images"):
        _prepare(tmp_path, {"a.npz": _npz(x=x, ids=np.array([1])), "b.npy": buf.getvalue()})


def test_a_npy_is_a_stack_along_its_first_axis_at_any_rank(tmp_path):
    """[N, *input_shape[1:]] is N samples whatever the rank: audio frames [N, 576], token ids [N, 7]."""
    frames = RNG.standard_normal((5, 576))
    buf = io.BytesIO()
    np.save(buf, frames)
    stack, summary = _prepare(tmp_path, {"f.npy": buf.getvalue()})
    assert stack.shape == (5, 576) and stack.dtype == np.float32 and summary["count"] == 5
    ids = np.arange(21).reshape(3, 7)
    buf = io.BytesIO()
    np.save(buf, ids)
    stack, _ = _prepare(tmp_path, {"ids.npy": buf.getvalue()}, dtype="int64")
    assert stack.dtype == np.int64 and stack.shape == (3, 7)
    np.testing.assert_array_equal(stack, ids)
    value = helper.make_tensor_value_info("tokens", TensorProto.INT64, [1, 7])
    out = helper.make_tensor_value_info("t", TensorProto.INT64, [1, 7])
    graph = helper.make_graph([helper.make_node("Identity", ["tokens"], ["t"])], "g", [value], [out])
    model = helper.make_model(graph)
    feeds = samples_for(model, stack, 8)
    assert len(feeds) == 3 and feeds[2]["tokens"].tolist() == [list(range(14, 21))]
