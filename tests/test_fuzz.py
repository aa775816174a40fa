"""The fuzzers of benchmarks/fuzz.py in the suite: only the project's own errors escape, no case
hangs, memory stays under a cap. The benchmark runs 2,000 cases of each; here BUILD files get a
seeded 300 (each evaluated in a child process), binaries a seeded 300 (each one is simulated) and
models a seeded 100 (each built, every stage, in the small workspace), and as many pre-quantized
(QDQ) models mutated from each form of the workspace's own export. (Models were 150 each until
the suite had to fit CI's 20 minutes: the three model fuzzers took 384 s of it; the benchmark's
2,000 per fuzzer are where breadth is measured.)"""

from __future__ import annotations

import resource
import sys

import pytest

from conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
import fuzz  # noqa: E402


@pytest.fixture
def capped_memory():
    """The fuzzer's address-space cap, on top of what this test process already maps: a suite
    worker that has run other modules first (onnxruntime's arenas, mapped caches) may be near
    6 GiB before a case starts, and its cases then failed for want of memory the fuzzer meant
    them to have (the exact-form QDQ fuzzer built 1 case of 150 in CI, 7 alone)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    with open("/proc/self/statm") as statm:
        mapped = int(statm.read().split()[0]) * resource.getpagesize()
    cap = mapped + fuzz.MEMORY_LIMIT
    resource.setrlimit(resource.RLIMIT_AS, (cap if hard == resource.RLIM_INFINITY else min(cap, hard), hard))
    yield
    resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


@pytest.mark.slow
def test_build_file_fuzzer(capped_memory):
    tally = fuzz.fuzz_build(300, seed=7)  # each case is a child process; the benchmark runs 2,000
    assert tally.cases == 300
    assert not tally.crashes and not tally.hangs, (tally.crashes[:5], tally.hangs[:5])
    assert tally.ok > 8 and tally.clean > 150  # it reaches both the evaluator and the rules


@pytest.mark.slow
def test_npub_fuzzer(cls_binary, capped_memory):
    tally = fuzz.fuzz_npub(cls_binary.read_bytes(), 300, seed=7)
    assert tally.cases == 300
    assert not tally.crashes and not tally.hangs, (tally.crashes[:5], tally.hangs[:5])
    assert tally.clean > 100


@pytest.mark.slow
def test_model_fuzzer(small_ws, warm_cache, capped_memory):
    tally = fuzz.fuzz_model(small_ws, warm_cache, 100, seed=7)
    assert tally.cases == 100
    assert not tally.crashes and not tally.hangs, (tally.crashes[:5], tally.hangs[:5])
    assert tally.ok > 20 and tally.clean > 50  # it reaches whole builds and the import's refusals


@pytest.mark.slow
@pytest.mark.parametrize("form", ["standard", "exact"])
def test_qdq_model_fuzzer(small_ws, warm_cache, capped_memory, form):
    tally = fuzz.fuzz_model(small_ws, warm_cache, 100, seed=7, quantized=form)
    assert tally.cases == 100
    assert not tally.crashes and not tally.hangs, (tally.crashes[:5], tally.hangs[:5])
    assert tally.ok > 2 and tally.clean > 50
