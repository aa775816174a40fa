"""The numeric check of optimize: both models in onnxruntime on the same calibration samples."""

from __future__ import annotations

import numpy as np
import onnx

from npubuild.errors import UserError
from npubuild.stages.feeds import samples_for, session


def compare(
    reference: onnx.ModelProto, candidate: onnx.ModelProto, tensors: np.ndarray, params: dict
) -> dict:
    feeds = samples_for(reference, tensors, params["check_samples"])
    ref, cand = session(reference), session(candidate)
    names = [o.name for o in ref.get_outputs()]
    outputs = {n: {"max_abs_diff": 0.0, "max_abs_ref": 0.0} for n in names}
    for feed in feeds:
        for name, a, b in zip(names, ref.run(names, feed), cand.run(names, feed)):
            a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
            if a64.shape != b64.shape:
                raise UserError(f"optimize changed the shape of output '{name}': {a64.shape} -> {b64.shape}")
            outputs[name]["max_abs_diff"] = max(
                outputs[name]["max_abs_diff"], float(np.max(np.abs(a64 - b64)))
            )
            outputs[name]["max_abs_ref"] = max(outputs[name]["max_abs_ref"], float(np.max(np.abs(a64))))
    worst = 0.0
    for o in outputs.values():
        o["tolerance"] = params["check_atol"] + params["check_rtol"] * o["max_abs_ref"]
        o["passed"] = o["max_abs_diff"] <= o["tolerance"]
        worst = max(worst, o["max_abs_diff"])
    return {
        "samples": len(feeds),
        "outputs": outputs,
        "max_abs_diff": worst,
        "passed": all(o["passed"] for o in outputs.values()),
    }
