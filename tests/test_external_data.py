"""ONNX external data is read only from files the BUILD declares beside the model, is part of the
action key and is embedded; a .npub may not refer to external data at all."""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from conftest import cli, write
from npubuild.targets import npub
from npubuild.targets.npub import NpubError
from npubuild.targets.runtime import Runtime

WEIGHTS = np.arange(4 * 3 * 3 * 3, dtype=np.float32).reshape(4, 3, 3, 3) / 100


def _model_with_external_weights(folder, location: str = "w.bin") -> None:
    """models/m.onnx: a Conv whose weights live in `location` (relative to the model)."""
    weight = numpy_helper.from_array(WEIGHTS, "W")
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "W"], ["y"], pads=[1, 1, 1, 1]),
            helper.make_node("Relu", ["y"], ["z"]),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 4, 8, 8])],
        [weight],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    raw = weight.raw_data
    weight.ClearField("raw_data")
    weight.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", "0"), ("length", str(len(raw)))):
        entry = weight.external_data.add()
        entry.key, entry.value = key, value
    model.graph.initializer[0].CopyFrom(weight)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "m.onnx").write_bytes(model.SerializeToString())
    target = (folder / location).resolve()
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(raw)


@pytest.fixture
def ws(tmp_path):
    root = tmp_path / "ws"
    write(root / "WORKSPACE", "")
    _model_with_external_weights(root / "models")
    return root


def _build(ws, cache, data: str = ""):
    write(ws / "models" / "BUILD", f'onnx_model(name = "m", src = "m.onnx"{data})\n')
    return cli(["build", "//models:m"], ws, cache)


def test_undeclared_external_data_is_refused_even_when_the_working_directory_has_it(ws, tmp_path):
    (ws / "w.bin").write_bytes(b"secret" * 100)  # the working directory's file must never be read
    proc = _build(ws, tmp_path / "cache")
    assert proc.returncode == 1
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "'w.bin'" in errors[0] and "list it in 'data'" in errors[0], proc.stderr


def test_declared_external_data_is_embedded_and_in_the_key(ws, tmp_path):
    cache = tmp_path / "cache"
    proc = _build(ws, cache, ', data = ["w.bin"]')
    assert proc.returncode == 0, proc.stderr
    canonical = onnx.load(str(ws / "npubuild-out" / "models" / "m" / "canonical.onnx"))
    (weight,) = canonical.graph.initializer
    assert weight.data_location == TensorProto.DEFAULT
    np.testing.assert_array_equal(numpy_helper.to_array(weight), WEIGHTS)
    assert "(1 cached)" in _build(ws, cache, ', data = ["w.bin"]').stdout
    # An in-place edit of the data file (same size, mtime restored) reruns import.
    data = ws / "models" / "w.bin"
    st = data.stat()
    raw = bytearray(data.read_bytes())
    raw[:4] = np.float32(7.0).tobytes()
    data.write_bytes(bytes(raw))
    os.utime(data, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert "(1 ran)" in _build(ws, cache, ', data = ["w.bin"]').stdout
    canonical = onnx.load(str(ws / "npubuild-out" / "models" / "m" / "canonical.onnx"))
    assert numpy_helper.to_array(canonical.graph.initializer[0]).flat[0] == 7.0


def test_a_location_outside_the_model_folder_cannot_be_declared(tmp_path):
    root = tmp_path / "ws"
    write(root / "WORKSPACE", "")
    _model_with_external_weights(root / "models" / "sub", location="../secret.bin")
    write(root / "models" / "BUILD", 'onnx_model(name = "m", src = "sub/m.onnx", data = ["secret.bin"])\n')
    proc = cli(["build", "//models:m"], root, tmp_path / "cache")
    assert proc.returncode == 1
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "must be in the folder of 'sub/m.onnx'" in errors[0], proc.stderr
    write(root / "models" / "BUILD", 'onnx_model(name = "m", src = "sub/m.onnx")\n')
    proc = cli(["build", "//models:m"], root, tmp_path / "cache")
    assert proc.returncode == 1 and "'../secret.bin'" in proc.stderr and "Traceback" not in proc.stderr


def test_a_npub_cpu_subgraph_with_external_data_is_refused(cls_binary, tmp_path, monkeypatch):
    binary = npub.read(cls_binary.read_bytes())
    meta = binary.meta
    k = next(i for i, sg in enumerate(meta["subgraphs"]) if sg["device"] == "cpu")  # the input's conversion
    start, size = meta["subgraphs"][k]["model"]
    cpu = binary.sections["cpu"]
    model = onnx.ModelProto()
    model.ParseFromString(cpu[start : start + size])
    secret = numpy_helper.from_array(np.zeros(4, np.float32), "leak")
    secret.ClearField("raw_data")
    secret.data_location = TensorProto.EXTERNAL
    entry = secret.external_data.add()
    entry.key, entry.value = "location", "secret.txt"
    model.graph.initializer.append(secret)
    data = model.SerializeToString()
    sections = dict(binary.sections)
    sections["cpu"] = cpu[:start] + data + cpu[start + size :]
    meta["subgraphs"][k]["model"] = [start, len(data)]
    for sg in meta["subgraphs"][k + 1 :]:
        if sg["device"] == "cpu":
            sg["model"] = [sg["model"][0] + len(data) - size, sg["model"][1]]
    forged = npub.Npub(binary.target_digest, meta, sections, binary.version)
    resealed = npub.read(npub.write(forged))  # a well-formed, checksummed binary
    monkeypatch.chdir(tmp_path)
    (tmp_path / "secret.txt").write_bytes(np.ones(4, np.float32).tobytes())
    runtime = Runtime(resealed)
    x = np.zeros(runtime.inputs[0]["shape"], np.float32)
    with pytest.raises(NpubError, match="refers to external data"):
        runtime.run({runtime.inputs[0]["name"]: x})
