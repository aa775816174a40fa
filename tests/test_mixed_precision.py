"""Sensitivity and mixed-precision search on the real PP-OCR classifier (small_ws)."""

from __future__ import annotations

import json

import pytest

from conftest import cli, run_build

# Left out of the quick tier (pytest -m "not slow"): it runs precision searches on a real model
pytestmark = pytest.mark.slow

SEARCH = ("search", "//models:cls_npu")
SENSITIVITY = ("sensitivity", "//models:cls_npu")
AFTER_SEARCH = {SEARCH} | {
    (stage, "//models:cls_npu") for stage in ("quantize", "evaluate", "partition", "codegen", "simulate")
}


def set_attr(ws, line: str) -> None:
    build = ws / "models" / "BUILD"
    text = build.read_text()
    marker = '    optimize = {"check_samples": 2},\n'
    assert marker in text
    build.write_text(text.replace(marker, marker + line))


def read(ws, name):
    return json.loads((ws / "npubuild-out" / "models" / "cls_npu" / name).read_text())


def test_without_a_goal_nothing_of_the_search_runs(small_ws, store):
    outcome = run_build(small_ws, store)
    assert {a.stage for a in outcome.actions}.isdisjoint({"sensitivity", "search"})


def test_goal_is_met_at_least_cost_and_changing_it_reruns_only_the_search(small_ws, store):
    # a goal the all-int8 model misses: with the spread default it reaches 0.999946 on the
    # search's two photos, past the 0.9999 this test asked for before
    set_attr(small_ws, '    mixed_precision = {"goal": {"cosine": 0.99999}},\n')
    first = run_build(small_ws, store)
    assert first.ok, first.errors
    assert {SENSITIVITY, SEARCH} <= first.executed()
    # sensitivity: every layer quantized alone; float alone only for the 25 most damaging
    sensitivity = read(small_ws, "sensitivity.json")
    layers = sensitivity["layers"]
    damage = sorted(layers, key=lambda r: (r["quantized_alone"]["cosine"], r["node"]))
    shortlist = {r["node"] for r in damage[:25]}
    assert len(layers) > 25 and sensitivity["float_alone_layers"] == 25
    assert {r["node"] for r in layers if r["float_alone"] is not None} == shortlist
    assert sensitivity["probe_runs"] == 1 + len(layers) + 25
    assert set(sensitivity["ranking"][:25]) == shortlist and len(sensitivity["ranking"]) == len(layers)
    search = read(small_ws, "search.json")
    int8 = search["path"][0]
    assert int8["action"] == "all layers int8" and not int8["goal_met"]
    # searched on the even-numbered evaluation photos (2 of 3), judged on the held-out one
    split, held = search["search_split"], search["held_out"]
    assert (split["samples"], held["samples"]) == (2, 1) and split["reached"] and split["cosine"] >= 0.99999
    assert search["reached"] == (held["cosine"] >= 0.99999) and search["cosine"] == held["cosine"]
    if not search["reached"]:  # the search's own figure does not hold on the image it never saw
        (warning,) = search["warnings"]
        assert "held-out" in warning and f"{held['cosine']:.5f}" in warning
        assert f"{split['cosine']:.5f}" in warning
    promoted = {k: v for k, v in search["precision"].items() if v != "int8"}
    # the default minimises estimated cycles, so the bound is on the table's cost; the int8 MAC
    # share is what that cost buys (81.6% at 1.16x before zero points were whole steps, 56.6% at
    # 1.19x after: the int8 start is closer to the goal, and a different set tips it)
    assert promoted and search["path"][-1]["cost"] <= 1.3 * int8["cost"]
    # the answer is a table a step of the search measured meeting the goal; quantize read it
    assert set(promoted) <= set(search["search_order"])
    assert any(p["goal_met"] and abs(p["cosine"] - split["cosine"]) < 1e-6 for p in search["path"])
    assert read(small_ws, "precision.json")["layers"] == promoted
    program_bits = {r["node"]: r["bits"] for r in read(small_ws, "accuracy.json")["layers"]}
    assert all(
        program_bits.get(node) == 16 for node, p in promoted.items() if p == "int16" and node in program_bits
    )
    # the integer model itself (golden interpreter) on all three evaluation photos: between what
    # the search saw and what it held out (the cosine of the union is at most the larger one's)
    (metrics,) = read(small_ws, "accuracy.json")["outputs"].values()
    low, high = sorted([split["cosine"], held["cosine"]])
    assert low - 1e-3 <= metrics["cosine"] <= high + 1e-6
    # hand-back: each remaining promoted layer was tried one level down and that failed the goal
    hand_backs = [p for p in search["path"] if p["action"].startswith("hand ")]
    assert all(not p["goal_met"] for p in hand_backs if p["action"].split()[1] in promoted)

    build = small_ws / "models" / "BUILD"
    build.write_text(build.read_text().replace('"cosine": 0.99999}', '"cosine": 0.999985}'))
    second = run_build(small_ws, store)
    assert second.executed() == AFTER_SEARCH or second.executed() == {SEARCH}  # identical table: early cutoff
    assert SENSITIVITY not in second.executed()


def test_unreachable_goal_is_reported_and_fails_only_when_enforced(small_ws, tmp_path):
    cache = tmp_path / "cache"
    set_attr(small_ws, '    mixed_precision = {"goal": {"sqnr": 300.0}, "candidates": ["int8", "int16"]},\n')
    proc = cli(["build", "//models:cls_npu"], small_ws, cache)
    assert proc.returncode == 0, proc.stderr
    assert "goal NOT met" in proc.stdout
    warning = [ln for ln in proc.stdout.splitlines() if ln.startswith("warning:") and "not reached" in ln]
    assert warning and "best found" in warning[0]
    assert "goal sqnr >= 300 not reached" in warning[0]  # as the BUILD file says it, not a dict
    build = small_ws / "models" / "BUILD"
    build.write_text(
        build.read_text().replace(
            '"candidates": ["int8", "int16"]}', '"candidates": ["int8", "int16"], "enforce": True}'
        )
    )
    failed = cli(["build", "//models:cls_npu"], small_ws, cache)
    assert failed.returncode == 1 and "Traceback" not in failed.stderr
    errors = [ln for ln in failed.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "not reachable" in errors[0] and "best found cosine" in errors[0]
    assert "models/BUILD:" in errors[0]


def test_hand_written_precision_table(small_ws, store):
    (small_ws / "models" / "precision.json").write_text(
        json.dumps(
            {"version": 1, "layers": {"Conv@0": "int16", "Softmax@0": "float", "NoSuchLayer": "int16"}}
        )
    )
    set_attr(small_ws, '    precision_table = "precision.json",\n')
    outcome = run_build(small_ws, store)
    assert outcome.ok, outcome.errors
    quantize = read(small_ws, "quantize.json")
    assert any("'NoSuchLayer'" in w for w in quantize["warnings"])
    bits = {r["node"]: r["bits"] for r in read(small_ws, "accuracy.json")["layers"]}
    assert bits["Conv@0"] == 16
    # editing the table reruns quantize and evaluate only
    (small_ws / "models" / "precision.json").write_text(
        json.dumps({"version": 1, "layers": {"Conv@0": "float"}})
    )
    again = run_build(small_ws, store)
    assert again.executed() == AFTER_SEARCH - {SEARCH}
    assert any(f["node"] == "Conv@0" for f in read(small_ws, "quantize.json")["float_nodes"])


@pytest.mark.parametrize(
    "line, message",
    [
        ('    mixed_precision = {"goal": {}},\n', "the goal needs 'cosine' and/or 'sqnr'"),
        (
            '    mixed_precision = {"goal": {"cosine": 0.99}, "candidates": ["int8"]},\n',
            "at least two precisions",
        ),
        ('    mixed_precision = {"goal": {"cosine": 0.99}},\n    precision_table = "p.json",\n', "not both"),
        ('    mixed_precision = {"goal": {"cosine": 0.99}, "minimize": "power"},\n', "minimize"),
    ],
    ids=["empty goal", "one candidate", "both", "unknown objective"],
)
def test_bad_mixed_precision_settings(small_ws, tmp_path, line, message):
    set_attr(small_ws, line)
    proc = cli(["build", "//models:cls_npu"], small_ws, tmp_path / "cache")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and message in errors[0] and "models/BUILD:" in errors[0]


def test_bad_precision_value_in_a_table(small_ws, tmp_path):
    (small_ws / "models" / "p.json").write_text(json.dumps({"version": 1, "layers": {"Conv@0": "int4"}}))
    set_attr(small_ws, '    precision_table = "p.json",\n')
    proc = cli(["build", "//models:cls_npu"], small_ws, tmp_path / "cache")
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert proc.returncode == 1 and len(errors) == 1
    assert "'Conv@0' has precision 'int4'" in errors[0]
