"""The split memo (targets/backend/split_memo.py): a split reused across the grouping search's
compiles is the split the cycle model's trials find, and the binary is the one compiled without it."""

from __future__ import annotations

import numpy as np
import pytest
from stripe_kit import SMALL, build_int8
from test_quantize import SETTINGS
from test_stripes import SIZE, _model

import npubuild.targets.backend.pipeline as pipeline_module
import npubuild.targets.compile as compile_module
from npubuild.targets.backend.split_memo import SplitMemo
from npubuild.targets.compile import compile_npub

SHARES = (0.125,)  # one resident budget (and its stripings, refinements): a shorter search


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


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """test_stripes' chains with conv1's result at 16 bits (test_pinning's model): stripes, a
    pinned table, constant slots and fresh constant areas among the choices the search compiles."""
    rng = np.random.default_rng(3)
    model = _model(rng)
    samples = rng.normal(size=(6, 3, SIZE, SIZE)).astype(np.float32)
    settings = {**SETTINGS, "overrides": [{"match": "conv1", "bits": 16}]}
    return build_int8(model, tmp_path_factory.mktemp("split_memo"), samples, settings)


def test_every_repeated_key_gets_the_split_its_trials_find(built, monkeypatch):
    model, program, arrays, _, plan = built
    checking = CheckingMemo()
    monkeypatch.setattr(compile_module, "SplitMemo", lambda: checking)
    checked = compile_npub(program, arrays, model, SMALL, plan, resident_shares=SHARES)
    assert checking.mismatches == []
    # many of the search's ops are keys seen before (PP-OCR cls on vnpu-m: 1,151 of 1,617)
    assert checking.repeats > (checking.repeats + len(checking.splits)) / 3
    monkeypatch.undo()
    trials = []
    choose = pipeline_module.choose_split
    monkeypatch.setattr(pipeline_module, "choose_split", lambda *a: trials.append(1) or choose(*a))
    reused = compile_npub(program, arrays, model, SMALL, plan, resident_shares=SHARES)
    # the binary, its listing and the search's record are those of the compile that reused nothing
    assert reused[0] == checked[0] and reused[1] == checked[1]
    assert reused[2]["grouping_search"] == checked[2]["grouping_search"]
    # the trials ran once per key, unless a fresh constant area had less room than they took
    assert len(checking.splits) <= len(trials) < len(checking.splits) + checking.repeats
