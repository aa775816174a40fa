"""Edit scenarios on a real model: each asserts the exact set of actions that ran."""

from __future__ import annotations

import os

from PIL import Image

from conftest import run_build

EVERYTHING = {
    ("import", "//models:cls"),
    ("prepare", "//data:calib"),
    ("prepare", "//data:eval"),
    ("optimize", "//models:cls_npu"),
}


def test_first_build_runs_everything_once(small_ws, store):
    outcome = run_build(small_ws, store)
    assert outcome.ok, outcome.errors
    assert outcome.executed() == EVERYTHING
    # Actions are shared: the onnx_model and the npu_model both need the same import.
    assert sum(1 for a in outcome.actions if a.stage == "import") == 1


def test_a_noop_rebuild_runs_nothing(small_ws, store):
    run_build(small_ws, store)
    outcome = run_build(small_ws, store)
    assert outcome.ok
    assert outcome.executed() == set()
    assert {r.status for r in outcome.results.values()} == {"cached"}


def test_b_touching_a_model_file_runs_nothing(small_ws, store):
    run_build(small_ws, store)
    model = small_ws / "models" / "cls.onnx"
    st = model.stat()
    os.utime(model, ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))
    assert run_build(small_ws, store).executed() == set()


def test_c_comment_and_reformatting_of_build_file_runs_nothing(small_ws, store):
    run_build(small_ws, store)
    build = small_ws / "models" / "BUILD"
    text = build.read_text()
    reformatted = "# The classifier.\n\n" + text.replace(" = ", "=").replace("\n)", "  # end of rule\n)\n\n")
    build.write_text(reformatted)
    assert run_build(small_ws, store).executed() == set()


def test_d_dataset_preprocessing_reruns_only_its_prepare_and_readers(small_ws, store):
    run_build(small_ws, store)
    build = small_ws / "data" / "BUILD"
    build.write_text(
        build.read_text().replace(
            'dataset(name = "calib", srcs = glob(["calib/*.png"]), preprocess = PRE)',
            'dataset(name = "calib", srcs = glob(["calib/*.png"]),\n'
            '        preprocess = {"resize": [48, 192], "color": "BGR", "mean": [0.45], "std": [0.5]})',
        )
    )
    assert run_build(small_ws, store).executed() == {
        ("prepare", "//data:calib"),
        ("optimize", "//models:cls_npu"),
    }


def test_e_optimize_option_reruns_only_that_optimize(small_ws, store):
    run_build(small_ws, store)
    build = small_ws / "models" / "BUILD"
    build.write_text(build.read_text().replace('"check_samples": 2', '"check_samples": 1'))
    assert run_build(small_ws, store).executed() == {("optimize", "//models:cls_npu")}
    # and a pass switched off changes the optimized model, so it reruns again
    build.write_text(
        build.read_text().replace('"check_samples": 1', '"check_samples": 1, "disable": ["fuse_hardswish"]')
    )
    outcome = run_build(small_ws, store)
    assert outcome.executed() == {("optimize", "//models:cls_npu")}


def test_f_early_cutoff_when_an_upstream_rerun_yields_identical_bytes(small_ws, store):
    run_build(small_ws, store)
    # Re-encode one calibration photo: different file bytes, identical pixels.
    photo = sorted((small_ws / "data" / "calib").glob("*.png"))[0]
    before = photo.read_bytes()
    Image.open(photo).save(photo, compress_level=1)
    assert photo.read_bytes() != before
    outcome = run_build(small_ws, store)
    # prepare reran (its input changed) and wrote the same tensors: optimize did not rerun.
    assert outcome.executed() == {("prepare", "//data:calib")}


def test_new_file_matched_by_a_glob_reruns_its_dataset(small_ws, store):
    run_build(small_ws, store)
    src = sorted((small_ws / "data" / "calib").glob("*.png"))[0]
    (small_ws / "data" / "calib" / "zz_copy.png").write_bytes(src.read_bytes())
    outcome = run_build(small_ws, store)
    assert outcome.executed() == {("prepare", "//data:calib"), ("optimize", "//models:cls_npu")}


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
    }


def test_until_import_stops_the_pipeline(small_ws, store):
    outcome = run_build(small_ws, store, until="import")
    assert outcome.executed() == {
        ("import", "//models:cls"),
        ("prepare", "//data:calib"),
        ("prepare", "//data:eval"),
    }
