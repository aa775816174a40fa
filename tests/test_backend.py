"""The back end through the CLI and the build: target edits, bad binaries and inputs, fallbacks,
and a fuzzed loader on a real compiled model."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import cli, run_build
from npubuild.targets import npub
from npubuild.targets.npub import ENTRY, FORMAT_MAJOR, HEADER, TRAILER, NpubError
from npubuild.targets.runtime import Runtime
from npubuild.targets.spec import BUILTIN_TARGETS

BACK_END = {(stage, "//models:cls_npu") for stage in ("partition", "codegen", "simulate")}


def out(ws, name):
    return ws / "npubuild-out" / "models" / "cls_npu" / name


def one_error_line(proc) -> str:
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr + proc.stdout
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1, proc.stderr
    return errors[0]


def test_changing_the_target_reruns_only_the_back_end(small_ws, warm_store):
    first = run_build(small_ws, warm_store)
    assert first.ok, first.errors
    small = json.loads(out(small_ws, "partition.json").read_text())
    build = small_ws / "models" / "BUILD"
    build.write_text(
        build.read_text().replace(
            '    optimize = {"check_samples": 2},\n',
            '    optimize = {"check_samples": 2},\n    target = "vnpu-s",\n',
        )
    )
    second = run_build(small_ws, warm_store)
    assert second.ok, second.errors
    assert second.executed() == BACK_END
    large = json.loads(out(small_ws, "partition.json").read_text())
    assert (small["target"], large["target"]) == ("vnpu-m", "vnpu-s")
    sim = json.loads(out(small_ws, "simulate.json").read_text())
    assert sim["bit_exact"]["ok"] and sim["bit_exact"]["elements"] > 0


def test_run_and_disasm_on_the_built_model(small_ws, tmp_path, warm_cache):
    cache = warm_cache
    assert cli(["build", "//models:cls_npu"], small_ws, cache).returncode == 0
    x = np.random.default_rng(0).normal(size=(1, 3, 48, 192)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    proc = cli(
        ["run", "//models:cls_npu", "--input", str(tmp_path / "x.npy"), "-o", str(tmp_path / "o")],
        small_ws,
        cache,
    )
    assert proc.returncode == 0, proc.stderr
    (written,) = list((tmp_path / "o").glob("*.npy"))
    binary = npub.read(out(small_ws, "model.npub").read_bytes())
    expected = Runtime(binary).run({"x": x})
    (value,) = expected.values()
    np.testing.assert_array_equal(np.load(written), value)
    listing = cli(["disasm", str(out(small_ws, "model.npub"))], small_ws, cache)
    assert listing.returncode == 0
    codegen = json.loads(out(small_ws, "codegen.json").read_text())
    lines = [ln for ln in listing.stdout.splitlines() if ln.strip()[:1].isdigit()]
    assert len(lines) == codegen["instructions"]
    assert listing.stdout == out(small_ws, "model.lst").read_text()


def _damaged(data: bytes) -> dict[str, bytes]:
    newer = bytearray(data[:-TRAILER])
    newer[8:10] = (FORMAT_MAJOR + 1).to_bytes(2, "little")
    flipped = bytearray(data)
    flipped[len(data) // 2] ^= 0x04
    return {
        "truncated": data[: len(data) // 3],
        "bit-flipped": bytes(flipped),
        "wrong magic": b"ELF\x7f" + data[4:],
        "newer version": bytes(newer) + hashlib.sha256(newer).digest(),
    }


@pytest.mark.parametrize("kind", ["truncated", "bit-flipped", "wrong magic", "newer version"])
def test_bad_binaries_are_one_clear_error(cls_binary, tmp_path, kind):
    bad = tmp_path / "bad.npub"
    bad.write_bytes(_damaged(cls_binary.read_bytes())[kind])
    np.save(tmp_path / "x.npy", np.zeros((1, 3, 48, 192), np.float32))
    for args in (["run", str(bad), "--input", str(tmp_path / "x.npy")], ["disasm", str(bad)]):
        line = one_error_line(cli(args, tmp_path, tmp_path / "cache"))
        assert "bad.npub" in line
    expected = {
        "truncated": "truncated",
        "bit-flipped": "checksum",
        "wrong magic": "magic",
        "newer version": "newer",
    }
    assert expected[kind] in line


@pytest.mark.parametrize(
    ("array", "message"),
    [(np.zeros((1, 3, 32, 32), np.float32), "shape"), (np.zeros((1, 3, 48, 192), np.int32), "dtype")],
)
def test_wrong_input_to_run_is_one_clear_error(cls_binary, tmp_path, array, message):
    np.save(tmp_path / "x.npy", array)
    line = one_error_line(
        cli(["run", str(cls_binary), "--input", str(tmp_path / "x.npy")], tmp_path, tmp_path / "c")
    )
    assert message in line


def test_an_op_the_target_lacks_falls_back_to_the_cpu_with_a_warning(small_ws, warm_cache):
    # the stages before partition come from the small workspace's build in warm_cache
    ops = [op for op in BUILTIN_TARGETS["vnpu-s"].supported_ops if op != "HardSigmoid"]
    build = small_ws / "models" / "BUILD"
    build.write_text(
        build.read_text().replace(
            '    optimize = {"check_samples": 2},\n',
            '    optimize = {"check_samples": 2},\n    target = ":nohs",\n',
        )
        + f'\nnpu_target(name = "nohs", base = "vnpu-s", supported_ops = {ops!r})\n'
    )
    proc = cli(["build", "//models:cls_npu"], small_ws, warm_cache)
    assert proc.returncode == 0, proc.stderr
    warnings = [ln for ln in proc.stdout.splitlines() if ln.startswith("warning:") and "HardSigmoid" in ln]
    assert warnings and "runs on the CPU" in warnings[0]
    plan = json.loads(out(small_ws, "partition.json").read_text())
    lacking = [f for f in plan["fallbacks"] if "HardSigmoid" in f["reason"]]
    assert lacking and plan["transitions"] > 2
    sim = json.loads(out(small_ws, "simulate.json").read_text())
    assert sim["bit_exact"]["ok"]


def _reseal(data: bytearray) -> bytes:
    """Fix every section CRC and the trailer, so the damage reaches the deeper checks."""
    import zlib

    count = min(HEADER.unpack_from(data)[5], 16)
    for i in range(count):
        at = HEADER.size + ENTRY.size * i
        kind, r0, offset, size, _, r1 = ENTRY.unpack_from(data, at)
        if offset + size <= len(data) - TRAILER:
            ENTRY.pack_into(
                data, at, kind, r0, offset, size, zlib.crc32(bytes(data[offset : offset + size])), r1
            )
    body = bytes(data[:-TRAILER])
    return body + hashlib.sha256(body).digest()


class _Blob(bytes):
    def __repr__(self) -> str:  # hypothesis prints its arguments; not a megabyte of them
        return f"<{len(self)} bytes of model.npub>"


@pytest.fixture(scope="module")
def real_binary(cls_binary) -> bytes:
    return _Blob(cls_binary.read_bytes())


@settings(
    max_examples=2000,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(data=st.data())
def test_loader_fuzz_on_a_real_binary_raises_only_its_own_error(real_binary, data):
    """Mutations aimed at the metadata and the instruction stream, resealed so that they pass the
    checksums: loading (parse, metadata, decoding every instruction) raises only NpubError."""
    binary = npub.read(real_binary)
    meta_at = HEADER.size + ENTRY.size * 4  # the table, then sections in kind order: meta first
    code_start = real_binary.find(binary.code[:64])
    region = data.draw(st.sampled_from(["meta", "code", "any"]))
    lo, hi = {
        "meta": (meta_at, meta_at + 4096),
        "code": (code_start, code_start + len(binary.code)),
        "any": (0, len(real_binary) - TRAILER),
    }[region]
    mutated = bytearray(real_binary)
    for _ in range(data.draw(st.integers(1, 6))):
        at = data.draw(st.integers(lo, max(lo, min(hi, len(real_binary) - TRAILER) - 1)))
        mutated[at] = data.draw(st.integers(0, 255))
    try:
        Runtime(npub.read(_reseal(mutated)))
    except NpubError:
        pass


def test_simulator_counters_agree_with_the_code_generators_estimate(small_ws, store):
    """The simulator counts what it executed (MACs from the tiles it computed, bytes its DMAs
    moved, the timeline of what it ran); codegen estimated the same from the stream it emitted."""
    outcome = run_build(small_ws, store)
    assert outcome.ok, outcome.errors
    estimate = json.loads(out(small_ws, "codegen.json").read_text())
    counted = json.loads(out(small_ws, "simulate.json").read_text())["counters"]
    assert counted["cycles"] == estimate["estimated_cycles"] > 0
    assert counted["macs"] == estimate["macs"] > 0
    assert counted["dma_in_bytes"] + counted["dma_out_bytes"] == estimate["dram_bytes"]
    # every op's cycles lie within the total, and the network bound is below the estimate
    assert all(0 <= r["start"] <= r["end"] <= estimate["estimated_cycles"] for r in estimate["layers"])
    assert 0 < estimate["roofline_cycles"] <= estimate["estimated_cycles"]
