"""evaluate names the evaluation samples that carry most of each output's error, and warns when
one sample carries most of it: the output's SQNR then says more about that sample than about the
model (ptq_vs_ort.py's PP-OCR cls row: one of 16 lines carried 86% of the error)."""

from __future__ import annotations

import json

import numpy as np

from conftest import cli
from npubuild.stages.evaluate import feed_sources
from npubuild.stages.metrics import dominant_sample_warning, worst_samples


def test_the_sample_with_most_of_the_error_comes_first_with_its_share():
    names = [f"line{k}.png" for k in range(8)]
    worst = worst_samples([1.0] * 7 + [100.0], names)
    assert [w["sample"] for w in worst] == [7, 0, 1]  # ties in sample order
    assert worst[0]["source"] == "line7.png"
    assert np.isclose(worst[0]["error_share"], 100 / 107, atol=1e-4)
    assert np.isclose(worst[1]["error_share"], 1 / 107, atol=1e-4)
    warning = dominant_sample_warning("y", worst, 8)
    assert warning is not None and "line7.png" in warning and "93%" in warning


def test_no_warning_where_the_error_is_spread_or_the_samples_few():
    names = [f"s{k}" for k in range(8)]
    assert dominant_sample_warning("y", worst_samples([1.0] * 8, names), 8) is None
    assert dominant_sample_warning("y", worst_samples([1.0] * 6 + [100.0], names[:7]), 7) is None
    assert worst_samples([0.0] * 8, names) == []  # an exact output has no worst sample
    assert worst_samples([1.0, float("inf")], names[:2]) == []


def test_a_feed_of_a_batched_input_is_named_by_its_samples_files(tmp_path):
    manifest = tmp_path / "manifest.json"
    manifest.write_text(json.dumps({"sources": ["a.npy", "a.npy", "b.png", "c.png"]}))
    feeds = [{"x": np.zeros((2, 3), np.float32)}, {"x": np.zeros((2, 3), np.float32)}]
    assert feed_sources(manifest, np.zeros((4, 3)), feeds) == ["a.npy", "b.png, c.png"]
    assert feed_sources(None, np.zeros((4, 3)), feeds) == ["sample 0", "sample 1"]
    for unlisted in ([], "a.npy", {"sources": "a.npy"}, {"sources": [1, 2, 3, 4]}):
        manifest.write_text(json.dumps(unlisted))
        assert feed_sources(manifest, np.zeros((4, 3)), feeds) == ["sample 0", "sample 1"]


def test_the_report_names_the_evaluation_files_behind_the_error(small_ws, warm_cache):
    assert cli(["build", "//models:cls_npu"], small_ws, warm_cache).returncode == 0
    report = json.loads((small_ws / "npubuild-out" / "models" / "cls_npu" / "accuracy.json").read_text())
    (worst,) = report["worst_samples"].values()
    files = {p.relative_to(small_ws / "data").as_posix() for p in (small_ws / "data" / "eval").glob("*.png")}
    assert worst and {w["source"] for w in worst} <= files
    shares = [w["error_share"] for w in worst]
    assert shares == sorted(shares, reverse=True) and 0 < sum(shares) <= 1.0001
    shown = cli(["report", "//models:cls_npu"], small_ws, warm_cache)
    assert shown.returncode == 0 and f"most of its error: {worst[0]['source']}" in shown.stdout
    assert cli(["report", "//models:cls_npu", "--html"], small_ws, warm_cache).returncode == 0
    page = (small_ws / "npubuild-out" / "models" / "cls_npu" / "report.html").read_text()
    assert f"<td>{worst[0]['source']}</td><td>{worst[0]['error_share']:.1%}</td>" in page
