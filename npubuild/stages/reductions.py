"""Float reductions whose result does not depend on the machine.

BLAS (np.dot, @ on floats) splits a sum across as many threads as it is allowed, so its rounding
changes with OMP_NUM_THREADS: a Ray worker (one thread) and a laptop would write different bytes
for the same inputs. numpy's own pairwise sums have one fixed order. Integer-valued products (the
golden interpreter, the simulator) are exact either way and keep BLAS.
"""

from __future__ import annotations

import numpy as np


def dot(a: np.ndarray, b: np.ndarray) -> float:
    """sum(a * b) over flat vectors, in a fixed order."""
    return float(np.multiply(a, b, dtype=np.float64).sum())


def vector_matrix(v: np.ndarray, m: np.ndarray) -> np.ndarray:
    """v @ m for a vector [K] and a matrix [K, N], in a fixed order, as float64."""
    return np.multiply(np.asarray(v, np.float64)[:, None], m, dtype=np.float64).sum(axis=0)
