"""benchmarks/calibration_draws.py: each draw leaves exactly one photograph's crops out of the
calibration set, as the BUILD language's glob reads the line it writes, and its summary line."""

from __future__ import annotations

import sys

from conftest import REPO, write
from npubuild.buildlang import evaluate
from npubuild.rules.registry import package_builtins

sys.path.insert(0, str(REPO / "benchmarks"))
from calibration_draws import PHOTO_CROPS, summary, without  # noqa: E402

CROPS = ["astronaut_0", "astronaut_11", "grace_2", "grace_hopper_0", "grace_hopper_5", "rocket_1"]


def _calibration_set(tmp_path, line: str) -> list[str]:
    for crop in CROPS:
        write(tmp_path / "data" / "crops" / "calib" / f"{crop}.png", "")
    source = f'{line}\ndataset(name = "calib", srcs = CALIBRATION)\n'
    write(tmp_path / "data" / "BUILD", source)
    targets: dict = {}
    builtins = package_builtins("data", tmp_path / "data", targets)
    evaluate(source, "data/BUILD", builtins, tmp_path, tmp_path / "data")
    return [src.rsplit("/", 1)[-1].removesuffix(".png") for src in targets["calib"].attrs.srcs]


def test_each_draw_leaves_out_one_photographs_crops_and_no_other(tmp_path):
    assert without(None) == PHOTO_CROPS
    assert _calibration_set(tmp_path, without(None)) == CROPS
    assert _calibration_set(tmp_path, without("astronaut")) == CROPS[2:]
    # `grace_*` would take grace_hopper's crops with grace's
    assert _calibration_set(tmp_path, without("grace")) == ["astronaut_0", "astronaut_11", *CROPS[3:]]
    assert _calibration_set(tmp_path, without("grace_hopper")) == [*CROPS[:3], "rocket_1"]


def test_the_summary_counts_only_the_draws_and_reports_the_whole_set_apart():
    differences = {None: -8.0, "a": 2.5, "b": -1.0, "c": 0.0, "d": -4.0}
    line = summary(differences)
    assert line == (
        "whole set -8.00; one photograph left out (4 draws): least -4.00, median -0.50, "
        "largest +2.50; at least as good in 2 of 4"
    )
    assert summary({None: 1.0}) is None
    assert "whole set n/a" in summary({"a": 1.0})
