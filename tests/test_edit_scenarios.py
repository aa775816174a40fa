"""Edit scenarios on a real model: each asserts the exact set of actions that ran. Most start from
a copy of a cache the small workspace's cold build filled (`warm_store`): what a rebuild runs after
an edit depends on the cache's contents, not on whether this test filled it."""

from __future__ import annotations

import json
import os

import pytest
from PIL import Image

from conftest import run_build

IMPORT = ("import", "//models:cls")
PREPARE_CALIB = ("prepare", "//data:calib")
PREPARE_EVAL = ("prepare", "//data:eval")
OPTIMIZE = ("optimize", "//models:cls_npu")
CALIBRATE = ("calibrate", "//models:cls_npu")
BACK_END = {(stage, "//models:cls_npu") for stage in ("partition", "codegen", "simulate")}
AFTER_CALIBRATE = {("quantize", "//models:cls_npu"), ("evaluate", "//models:cls_npu")} | BACK_END
QUANTIZED = {CALIBRATE} | AFTER_CALIBRATE
EVERYTHING = {IMPORT, PREPARE_CALIB, PREPARE_EVAL, OPTIMIZE} | QUANTIZED


def edit(path, old, new):
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))


def test_first_build_runs_everything_once(small_ws, store):
    outcome = run_build(small_ws, store)
    assert outcome.ok, outcome.errors
    assert outcome.executed() == EVERYTHING
    # Actions are shared: the onnx_model and the npu_model both need the same import.
    assert sum(1 for a in outcome.actions if a.stage == "import") == 1


def test_a_noop_rebuild_runs_nothing(small_ws, warm_store):
    run_build(small_ws, warm_store)
    outcome = run_build(small_ws, warm_store)
    assert outcome.ok
    assert outcome.executed() == set()
    assert {r.status for r in outcome.results.values()} == {"cached"}


def test_b_touching_a_model_file_runs_nothing(small_ws, warm_store):
    run_build(small_ws, warm_store)
    model = small_ws / "models" / "cls.onnx"
    st = model.stat()
    os.utime(model, ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))
    assert run_build(small_ws, warm_store).executed() == set()


def test_c_comment_and_reformatting_of_build_file_runs_nothing(small_ws, warm_store):
    run_build(small_ws, warm_store)
    build = small_ws / "models" / "BUILD"
    text = build.read_text()
    build.write_text(
        "# The classifier.\n\n" + text.replace(" = ", "=").replace("\n)", "  # end of rule\n)\n\n")
    )
    assert run_build(small_ws, warm_store).executed() == set()


def test_d_dataset_preprocessing_reruns_only_its_prepare_and_readers(small_ws, warm_store):
    run_build(small_ws, warm_store)
    edit(
        small_ws / "data" / "BUILD",
        'dataset(name = "calib", srcs = glob(["calib/*.png"]), preprocess = PRE)',
        'dataset(name = "calib", srcs = glob(["calib/*.png"]),\n'
        '        preprocess = {"resize": [48, 192], "color": "BGR", "mean": [0.45], "std": [0.5]})',
    )
    assert run_build(small_ws, warm_store).executed() == {PREPARE_CALIB, OPTIMIZE} | QUANTIZED


def test_d_a_loaded_macro_is_a_build_input_its_comments_are_not(small_ws, store):
    """data/BUILD made by a macro of tools/defs.bzl: the .bzl file is read like a BUILD file."""
    (small_ws / "tools").mkdir()
    defs = small_ws / "tools" / "defs.bzl"
    defs.write_text(
        'def sets(pre):\n    dataset(name = "calib", srcs = glob(["calib/*.png"]), preprocess = pre)\n'
    )
    edit(
        small_ws / "data" / "BUILD",
        'dataset(name = "calib", srcs = glob(["calib/*.png"]), preprocess = PRE)',
        "sets(PRE)",
    )
    build = small_ws / "data" / "BUILD"
    build.write_text('load("//tools:defs.bzl", "sets")\n' + build.read_text())
    assert run_build(small_ws, store).executed() == EVERYTHING
    defs.write_text("# The data sets.\n\n" + defs.read_text().replace(" = ", "="))
    assert run_build(small_ws, store).executed() == set()
    edit(defs, "preprocess=pre)", "preprocess=dict(pre, mean = [0.45]))")
    assert run_build(small_ws, store).executed() == {PREPARE_CALIB, OPTIMIZE} | QUANTIZED


def test_e_optimize_option_reruns_only_that_optimize(small_ws, warm_store):
    run_build(small_ws, warm_store)
    build = small_ws / "models" / "BUILD"
    edit(build, '"check_samples": 2', '"check_samples": 1')
    # optimize reran and wrote the same model: calibrate and what follows did not (early cutoff)
    assert run_build(small_ws, warm_store).executed() == {OPTIMIZE}
    # a pass switched off changes the optimized model, so everything reading it reruns
    edit(build, '"check_samples": 1', '"check_samples": 1, "disable": ["fuse_hardswish"]')
    assert run_build(small_ws, warm_store).executed() == {OPTIMIZE} | QUANTIZED


def test_f_early_cutoff_when_an_upstream_rerun_yields_identical_bytes(small_ws, warm_store):
    run_build(small_ws, warm_store)
    # Re-encode one calibration photo: different file bytes, identical pixels.
    photo = sorted((small_ws / "data" / "calib").glob("*.png"))[0]
    before = photo.read_bytes()
    Image.open(photo).save(photo, compress_level=1)
    assert photo.read_bytes() != before
    # prepare reran (its input changed) and wrote the same tensors: nothing after it reran.
    assert run_build(small_ws, warm_store).executed() == {PREPARE_CALIB}


def test_renaming_an_evaluation_photo_reruns_its_prepare_and_the_evaluate_that_names_it(small_ws, warm_store):
    run_build(small_ws, warm_store)
    photos = sorted((small_ws / "data" / "eval").glob("*.png"))
    first = photos[0]
    renamed = first.with_name(first.stem + "_renamed.png")  # sorts where it did: same tensors
    assert sorted([renamed.name, *(p.name for p in photos[1:])])[0] == renamed.name
    first.rename(renamed)
    # prepare reran and wrote the same tensors, but its manifest names the new file: evaluate,
    # which names the samples behind the error, reruns; simulate, which reads only the tensors,
    # does not
    assert run_build(small_ws, warm_store).executed() == {PREPARE_EVAL, ("evaluate", "//models:cls_npu")}
    report = json.loads((small_ws / "npubuild-out" / "models" / "cls_npu" / "accuracy.json").read_text())
    named = {w["source"] for rows in report["worst_samples"].values() for w in rows}
    assert f"eval/{first.name}" not in named


def test_new_file_matched_by_a_glob_reruns_its_dataset(small_ws, warm_store):
    run_build(small_ws, warm_store)
    src = sorted((small_ws / "data" / "calib").glob("*.png"))[0]
    (small_ws / "data" / "calib" / "zz_copy.png").write_bytes(src.read_bytes())
    assert run_build(small_ws, warm_store).executed() == {PREPARE_CALIB, OPTIMIZE} | QUANTIZED


@pytest.mark.parametrize(
    "setting",
    [
        '    quantize = {"method": "minmax"},\n',
        '    quantize = {"method": "percentile", "percentile": 99.9},\n',
        '    quantize = {"activation_bits": 16},\n',
        '    overrides = [{"op_type": "GlobalAveragePool", "keep_float": True}],\n',
        '    quantize = {"empirical_bias": False},\n',
        '    quantize = {"weight_rounding": "gptq"},\n',
    ],
    ids=["method", "percentile", "bits", "override", "empirical_bias", "weight_rounding"],
)
def test_quantize_settings_rerun_quantize_and_readers_never_calibrate(small_ws, warm_store, setting):
    run_build(small_ws, warm_store)
    edit(
        small_ws / "models" / "BUILD",
        '    optimize = {"check_samples": 2},\n',
        '    optimize = {"check_samples": 2},\n' + setting,
    )
    outcome = run_build(small_ws, warm_store)
    assert outcome.ok, outcome.errors
    assert outcome.executed() == AFTER_CALIBRATE


def test_scale_migrations_rerun_optimize_and_what_reads_a_changed_model(small_ws, warm_store):
    """equalize and the smoothing settings are quantize settings that optimize runs. Equalizing
    or smoothing the classifier's ReLU-joined convolutions changes its optimized model, so all
    that reads it reruns; switching off the default LayerNorm smoothing (it has no LayerNorm)
    reruns optimize alone, which writes the model the first build cached."""
    run_build(small_ws, warm_store)
    build = small_ws / "models" / "BUILD"
    edit(
        build,
        '    optimize = {"check_samples": 2},\n',
        '    optimize = {"check_samples": 2},\n    quantize = {"equalize": True},\n',
    )
    summary = small_ws / "npubuild-out" / "models" / "cls_npu" / "optimize.json"
    outcome = run_build(small_ws, warm_store)
    assert outcome.ok, outcome.errors
    assert outcome.executed() == {OPTIMIZE} | QUANTIZED
    assert json.loads(summary.read_text())["equalized"]["pairs"] > 0
    edit(build, '{"equalize": True}', '{"smooth_convolutions": True}')
    outcome = run_build(small_ws, warm_store)
    assert outcome.ok, outcome.errors
    assert outcome.executed() == {OPTIMIZE} | QUANTIZED
    smoothed = json.loads(summary.read_text())
    assert smoothed["equalized"] is None and smoothed["smoothed"]["convolution_pairs"] > 0
    edit(build, '{"smooth_convolutions": True}', '{"smooth": None}')
    outcome = run_build(small_ws, warm_store)
    assert outcome.ok, outcome.errors
    assert outcome.executed() == {OPTIMIZE}
    assert json.loads(summary.read_text())["smoothed"] is None


def test_parallel_build_gives_byte_identical_artifacts(small_ws, store, tmp_path):
    from npubuild.cache.store import Store

    first = run_build(small_ws, store, jobs=1)
    out = small_ws / "npubuild-out" / "models" / "cls_npu"
    serial = {p.name: p.read_bytes() for p in out.iterdir()}
    other = Store(tmp_path / "other-cache")
    second = run_build(small_ws, other, jobs=2)
    assert second.ok and second.executed() == first.executed() == EVERYTHING
    parallel = {p.name: p.read_bytes() for p in out.iterdir()}
    assert serial == parallel
    assert set(serial) == {
        "canonical.onnx",
        "import.json",
        "optimized.onnx",
        "optimize_log.json",
        "optimize.json",
        "stats.npbt",
        "calibrate.json",
        "quantized.npq",
        "quantized.qdq.onnx",
        "quantize.json",
        "accuracy.json",
        "partition.json",
        "codegen.json",
        "model.npub",
        "model.lst",
        "simulate.json",
    }


def test_until_import_stops_the_pipeline(small_ws, store):
    # the data sets are targets of //... themselves, so they are prepared anyway
    assert run_build(small_ws, store, until="import").executed() == {IMPORT, PREPARE_CALIB, PREPARE_EVAL}


def test_until_quantize_skips_evaluate(small_ws, store):
    executed = run_build(small_ws, store, until="quantize").executed()
    assert executed == EVERYTHING - {("evaluate", "//models:cls_npu")} - BACK_END
