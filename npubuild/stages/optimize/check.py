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


class SampleFile:
    """A [N, ...] .npy stack read one sample at a time with plain reads: neither the whole array nor
    a memory map of it is held, so memory does not grow with N."""

    def __init__(self, path):
        self.path = path
        with open(path, "rb") as f:
            version = np.lib.format.read_magic(f)
            read_header = (
                np.lib.format.read_array_header_1_0
                if version == (1, 0)
                else (np.lib.format.read_array_header_2_0)
            )
            shape, fortran, dtype = read_header(f)
            self.offset = f.tell()
        if fortran:
            raise UserError(f"{path}: Fortran-ordered tensor files are not supported")
        self.shape, self.dtype = shape, dtype
        self.sample_bytes = int(np.prod(shape[1:], dtype=np.int64)) * dtype.itemsize

    def __len__(self) -> int:
        return self.shape[0] if self.shape else 0

    def __getitem__(self, index: int | slice) -> np.ndarray:
        start, stop, step = index.indices(len(self)) if isinstance(index, slice) else (index, index + 1, 1)
        if step != 1:
            raise IndexError("only contiguous slices")
        with open(self.path, "rb") as f:
            f.seek(self.offset + start * self.sample_bytes)
            data = f.read((stop - start) * self.sample_bytes)
        array = np.frombuffer(data, dtype=self.dtype).reshape((stop - start, *self.shape[1:]))
        return array if isinstance(index, slice) else array[0]


def iterate_feeds(model: onnx.ModelProto, tensors, count: int):
    """Like samples_for, but yields one feed at a time (streaming)."""
    first = samples_for(model, tensors[0:1], 1)[0]
    name = next(iter(first))
    batch = first[name].shape[0]
    usable = min(count * batch, len(tensors) - len(tensors) % batch)
    for start in range(0, usable, batch):
        yield {name: np.ascontiguousarray(tensors[start : start + batch])}


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
