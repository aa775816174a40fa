"""A process the build starts (a pool worker, a stage's child: isolated.py) dies with the build."""

from __future__ import annotations

import os
import sys
import tempfile


def bind_to_parent(parent: int, temp: str) -> None:
    """A pool worker (or a stage's child process, isolated.py) lives only as long as the build
    that started it. Ctrl-C reaches the whole process group: the parent handles it, the worker
    ignores it. If the parent dies (SIGTERM, kill -9) the kernel kills the worker (Linux), and a
    watcher thread exits it everywhere else. Its temporary directories go in `temp`, which the
    parent deletes."""
    import signal
    import threading
    import time

    tempfile.tempdir = temp

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent:  # the parent died before the line above took effect
        os._exit(1)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, daemon=True, name="npubuild-parent-watch").start()
