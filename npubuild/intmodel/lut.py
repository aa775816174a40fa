"""Float definitions of the unary functions that become lookup tables (float32, as onnxruntime)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np


def lut_function(op_type: str, attrs: dict) -> Callable[[np.ndarray], np.ndarray]:
    fn = _function(op_type, attrs)

    def quiet(x: np.ndarray) -> np.ndarray:
        with np.errstate(over="ignore"):  # exp overflow saturates to the right limit
            return fn(x)

    return quiet


def _function(op_type: str, attrs: dict) -> Callable[[np.ndarray], np.ndarray]:
    one = np.float32(1)
    if op_type == "Sigmoid":
        return lambda x: one / (one + np.exp(-x))
    if op_type == "Tanh":
        return np.tanh
    if op_type == "HardSigmoid":
        alpha, beta = np.float32(attrs.get("alpha", 0.2)), np.float32(attrs.get("beta", 0.5))
        return lambda x: np.clip(alpha * x + beta, 0, 1).astype(np.float32)
    if op_type == "HardSwish":
        return lambda x: x * np.clip(x * np.float32(1 / 6) + np.float32(0.5), 0, 1).astype(np.float32)
    if op_type == "SiLU":
        return lambda x: x * (one / (one + np.exp(-x)))
    raise KeyError(op_type)
