"""Feeding models: onnxruntime sessions run the same way every time, and calibration or
evaluation samples streamed from a prepared tensor stack, one feed at a time."""

from __future__ import annotations

import numpy as np
import onnx

from npubuild.errors import UserError
from npubuild.stages.onnx_utils import dims


def read_npy_header(f) -> tuple[tuple[int, ...], bool, np.dtype]:
    """(shape, fortran order, dtype) of the .npy file `f` is at the start of; leaves it at the data."""
    version = np.lib.format.read_magic(f)
    reader = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    return reader(f)


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
            shape, fortran, dtype = read_npy_header(f)
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
