"""Samples of a stage measured in threads, results taken in sample order.

numpy's large array operations, BLAS and onnxruntime release the GIL, so two samples in two
threads use two cores. A stage reduces the results in the order of its samples, never in the
order they finish, so its artifact is the same for any worker count.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")


def sample_workers() -> int:
    """Threads per stage: the cores this process may use, at most 4 (memory grows with each
    sample in flight); NPUBUILD_SAMPLE_THREADS overrides."""
    given = os.environ.get("NPUBUILD_SAMPLE_THREADS", "")
    if given.isdigit() and int(given) > 0:
        return int(given)
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return max(1, min(cores, 4))


def in_order(work: Callable[[T], R], items: Iterable[T], workers: int) -> Iterator[R]:
    """work(item) for every item, `workers` at a time, yielded in the items' order; at most
    2 x workers results wait in memory."""
    items = list(items)
    if workers <= 1 or len(items) <= 1:
        yield from map(work, items)
        return
    from threadpoolctl import threadpool_limits

    # one BLAS thread per sample: BLAS's own threads would fight the samples' for the same cores
    with threadpool_limits(1, user_api="blas"), ThreadPoolExecutor(workers) as pool:
        pending = []
        for item in items:
            pending.append(pool.submit(work, item))
            if len(pending) >= 2 * workers:
                yield pending.pop(0).result()
        while pending:
            yield pending.pop(0).result()
