"""Action keys and the content-addressed store."""

from pathlib import Path

import pytest

from npubuild.cache.digest import canonical_json, sha256_bytes
from npubuild.cache.store import CorruptBlob, Store
from npubuild.engine.actions import Action, Output, SourceFile


def test_key_depends_on_stage_version_params_and_input_digests_only():
    a = Action(
        "import", {"opset": 13, "input_shapes": {}}, {"model": SourceFile(Path("/x/a.onnx"), "a")}, "//a"
    )
    b = Action(
        "import", {"input_shapes": {}, "opset": 13}, {"model": SourceFile(Path("/y/b.onnx"), "b")}, "//b"
    )
    digests = {"model": "1" * 64}
    assert a.key(digests) == b.key(digests)  # names and paths do not matter, contents do
    assert a.key(digests) != a.key({"model": "2" * 64})
    c = Action("import", {"opset": 14, "input_shapes": {}}, a.inputs, "//a")
    assert c.key(digests) != a.key(digests)
    d = Action("prepare", a.params, a.inputs, "//a")
    assert d.key(digests) != a.key(digests)


def test_key_uses_input_digest_not_producer_identity():
    up1 = Action("import", {"opset": 13}, {}, "//a")
    up2 = Action("import", {"opset": 14}, {}, "//a")
    down1 = Action("optimize", {}, {"model": Output(up1, "model")}, "//a")
    down2 = Action("optimize", {}, {"model": Output(up2, "model")}, "//a")
    assert down1.identity != down2.identity
    assert down1.key({"model": "f" * 64}) == down2.key({"model": "f" * 64})


def test_canonical_json_is_order_independent():
    assert canonical_json({"b": 1, "a": [1, {"d": 2, "c": 3}]}) == canonical_json(
        {"a": [1, {"c": 3, "d": 2}], "b": 1}
    )


def test_store_round_trip_and_corruption_is_detected(tmp_path):
    store = Store(tmp_path / "c")
    data = b"x" * 100_000
    digest = store.put_bytes(data)
    assert digest == sha256_bytes(data)
    assert store.read_bytes(digest) == data
    path = store.blob_path(digest)
    with open(path, "r+b") as f:
        f.seek(5000)
        f.write(b"y")
    with pytest.raises(CorruptBlob):
        store.read_bytes(digest)
    assert not store.has_blob(digest)  # evicted


def test_copy_to_verifies_and_leaves_no_partial_file(tmp_path):
    store = Store(tmp_path / "c")
    digest = store.put_bytes(b"z" * 50_000)
    with open(store.blob_path(digest), "r+b") as f:
        f.write(b"bad")
    dest = tmp_path / "out" / "f.bin"
    with pytest.raises(CorruptBlob):
        store.copy_to(digest, dest)
    assert not dest.exists()
    assert list(dest.parent.iterdir()) == []


def test_stat_cache_rehashes_changed_files(tmp_path):
    import os

    store = Store(tmp_path / "c")
    f = tmp_path / "src.bin"
    f.write_bytes(b"one")
    old = 1_600_000_000_000_000_000
    os.utime(f, ns=(old, old))
    first = store.source_digest(f)
    f.write_bytes(b"two")  # same size
    os.utime(f, ns=(old, old + 1))
    assert store.source_digest(f) != first
    assert store.source_digest(f) == sha256_bytes(b"two")
