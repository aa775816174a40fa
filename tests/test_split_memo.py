"""The split memo (targets/backend/split_memo.py): a split reused across the grouping search's
compiles is the split the cycle model's trials find, and the binary is the one compiled without it."""

from __future__ import annotations

import pytest

import npubuild.targets.backend.pipeline as pipeline_module
import npubuild.targets.compile as compile_module
from npubuild.intmodel.interpreter import load_integer_model
from npubuild.stages.onnx_utils import load_model
from npubuild.targets.backend.split_memo import SplitMemo
from npubuild.targets.compile import compile_npub, plan_partition
from npubuild.targets.spec import BUILTIN_TARGETS


class CheckingMemo(SplitMemo):
    """Reuses nothing: every op's trials run, and a key seen before must give the split (and the
    fresh constant bytes) it gave then."""

    def __init__(self) -> None:
        super().__init__()
        self.repeats = 0
        self.mismatches: list[tuple] = []

    def get(self, key, lowering):
        return None

    def put(self, key, split, fresh_bytes):
        if key in self.splits:
            self.repeats += 1
            if self.splits[key] != (split, fresh_bytes):
                self.mismatches.append((key, self.splits[key], (split, fresh_bytes)))
        self.splits[key] = (split, fresh_bytes)


@pytest.mark.parametrize("target_name", ["vnpu-s", "vnpu-m"])
def test_every_repeated_key_gets_the_split_its_trials_find(small_build, target_name, monkeypatch):
    """The real PP-OCR classifier at int8 (the small workspace's build), on either target: its
    grouping search compiles it with constant slots, fresh constant areas, several resident
    budgets and their refinements (the example's cls table on vnpu-m: 25 compiles)."""
    out = small_build / "ws" / "npubuild-out" / "models" / "cls_npu"
    model = load_model(out / "optimized.onnx", "the optimized model")
    program, arrays, _ = load_integer_model(out / "quantized.npq")
    target = BUILTIN_TARGETS[target_name]
    plan = plan_partition(program, arrays, model, target)
    checking = CheckingMemo()
    monkeypatch.setattr(compile_module, "SplitMemo", lambda: checking)
    checked = compile_npub(program, arrays, model, target, plan)
    assert checking.mismatches == []
    # many of the search's ops are keys seen before (the example's cls table on vnpu-m: 1,151 of
    # 1,617 lookups)
    assert checking.repeats > (checking.repeats + len(checking.splits)) / 3
    monkeypatch.undo()
    trials = []
    choose = pipeline_module.choose_split
    monkeypatch.setattr(pipeline_module, "choose_split", lambda *a: trials.append(1) or choose(*a))
    reused = compile_npub(program, arrays, model, target, plan)
    # the binary, its listing and the search's record are those of the compile that reused nothing
    assert reused[0] == checked[0] and reused[1] == checked[1]
    assert reused[2]["grouping_search"] == checked[2]["grouping_search"]
    # the trials ran once per key, unless a fresh constant area had less room than they took
    assert len(checking.splits) <= len(trials) < len(checking.splits) + checking.repeats
