"""The numeric check of optimize: both models in onnxruntime on the same calibration samples."""

from __future__ import annotations

import numpy as np
import onnx

from npubuild.errors import UserError
from npubuild.stages.onnx_utils import dims


def session(model: onnx.ModelProto):
    import onnxruntime as ort

    options = ort.SessionOptions()
    # One thread and no graph rewrites: the reference runs exactly this graph, the same way each time.
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3  # unused initializers in imported models are not worth a warning
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def samples_for(model: onnx.ModelProto, tensors: np.ndarray, count: int) -> list[dict[str, np.ndarray]]:
    """Feed dicts for the model's single input from a [N, ...] stack of samples."""
    initializers = {t.name for t in model.graph.initializer}
    graph_inputs = [i for i in model.graph.input if i.name not in initializers]
    if len(graph_inputs) != 1:
        raise UserError(f"the model has {len(graph_inputs)} inputs; a dataset feeds models with one input")
    value = graph_inputs[0]
    want = [int(d) for d in dims(value)]
    dtype = onnx.helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type)
    batch = want[0] if want else 1
    if list(tensors.shape[1:]) != want[1:]:
        raise UserError(
            f"the calibration set gives samples of shape {list(tensors.shape[1:])}, but model input "
            f"'{value.name}' expects {want} (check the dataset's preprocess.resize and layout)"
        )
    if tensors.dtype != dtype:
        raise UserError(
            f"the calibration set is {tensors.dtype}, but model input '{value.name}' is {dtype.name}"
        )
    feeds = []
    for start in range(0, min(count * batch, len(tensors) - len(tensors) % batch), batch):
        feeds.append({value.name: np.ascontiguousarray(tensors[start : start + batch])})
    if not feeds:
        raise UserError(f"the calibration set has {len(tensors)} samples, fewer than one batch of {batch}")
    return feeds


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
