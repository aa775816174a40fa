"""`npubuild cache gc --max-size`: least recently used action results go first, with the artifacts
no kept result names; what is kept still builds with nothing to run."""

from __future__ import annotations

import re
import time

from conftest import cli, run_build
from npubuild.cache.store import Store


def keys(outcome) -> set[str]:
    return {r.key for r in outcome.results.values()}


def footprint(store: Store, outcome) -> int:
    digests = {d for r in outcome.results.values() for d in r.outputs.values()}
    return sum(len(store.read_bytes(d)) for d in digests)


def test_gc_evicts_the_least_recently_used_results(small_ws, warm_cache):
    cache = warm_cache  # the first configuration's results: the session's build of it
    build = small_ws / "models" / "BUILD"
    on_m = build.read_text()
    on_s = on_m.replace('evaluation = "//data:eval",', 'evaluation = "//data:eval",\n    target = "vnpu-s",')
    store = Store(cache)
    first = run_build(small_ws, store)
    assert first.ok, first.errors
    store.touch_actions(sorted(keys(first)), now=time.time() - 24 * 3600)  # used yesterday
    build.write_text(on_s)
    second = run_build(small_ws, store)
    assert second.ok and second.executed() == {
        ("partition", "//models:cls_npu"),
        ("codegen", "//models:cls_npu"),
        ("simulate", "//models:cls_npu"),
    }
    only_first = keys(first) - keys(second)
    assert len(only_first) == 3
    limit = footprint(store, second)
    store.close()

    proc = cli(["cache", "gc", "--max-size", str(limit)], cwd=small_ws, cache=cache)
    assert proc.returncode == 0, proc.stderr
    kept, evicted = map(
        int, re.search(r"kept (\d+) action results.*evicted (\d+) results", proc.stdout).groups()
    )
    assert (kept, evicted) == (len(keys(second)), 3)

    store = Store(cache)
    assert all(store.get_action(k) is None for k in only_first)
    assert all(store.get_action(k) is not None for k in keys(second))
    assert run_build(small_ws, store).executed() == set()  # the recent configuration is whole
    build.write_text(on_m)
    assert run_build(small_ws, store).executed() == {  # exactly what was evicted reruns
        ("partition", "//models:cls_npu"),
        ("codegen", "//models:cls_npu"),
        ("simulate", "//models:cls_npu"),
    }
    store.close()

    proc = cli(["cache", "gc", "--max-size", "0"], cwd=small_ws, cache=cache)
    assert proc.returncode == 0, proc.stderr
    store = Store(cache)
    assert store.stats()["ac"] == 0 and store.stats()["cas"] == 0
    store.close()


def test_gc_rejects_a_size_it_cannot_read(small_ws, tmp_path):
    proc = cli(["cache", "gc", "--max-size", "lots"], cwd=small_ws, cache=tmp_path / "cache")
    assert proc.returncode == 1
    assert (
        proc.stderr.strip().startswith("error:")
        and "500M" in proc.stderr
        and len(proc.stderr.splitlines()) == 1
    )
