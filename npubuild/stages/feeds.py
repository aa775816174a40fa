"""Feeding models: onnxruntime sessions run the same way every time, and calibration or
evaluation samples streamed from a prepared tensor stack, one feed at a time."""

from __future__ import annotations

from collections.abc import Collection

import numpy as np
import onnx

from npubuild.errors import UserError
from npubuild.intmodel.codes import fits_integer
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
    # no log lines of its own: unused initializers in imported models are not worth a warning, and
    # a model it cannot load raises, which the caller says in one line
    options.log_severity_level = 4
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def float_values(model: onnx.ModelProto, names, feeds: list[dict]):
    """Per feed, in order, the float model's value of each tensor in `names` (onnxruntime, one
    session for all feeds; a name that is one of the feed's inputs is the feed's own array)."""
    from npubuild.stages.onnx_utils import with_outputs

    if not feeds:
        return
    sess = session(with_outputs(model, [n for n in names if n not in feeds[0]]))
    outputs = [o.name for o in sess.get_outputs()]
    for feed in feeds:
        yield {**dict(zip(outputs, sess.run(outputs, feed))), **feed}


def model_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    """The inputs a feed must give (initializers listed as inputs are not among them)."""
    initializers = {t.name for t in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in initializers]


def _conform(array: np.ndarray, value: onnx.ValueInfoProto, what: str) -> np.ndarray:
    """`array` as the dtype of model input `value` when both are integers and no value changes
    (token ids saved as int32 for an int64 input), or both are floats. Integers for a float input
    are refused: raw pixels fed to a model that expects normalised ones is a mistake, not a cast."""
    want = onnx.helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type)
    if array.dtype == want:
        return array
    cast = array.astype(want)
    if array.dtype.kind == "f" and want.kind == "f":
        return cast
    if array.dtype.kind in "iu" and want.kind in "iu" and fits_integer(array, want):
        return cast
    raise UserError(
        f"{what} is {array.dtype}, but model input '{value.name}' is {want.name} (values would change)"
    )


def _named_feeds(model: onnx.ModelProto, records: np.ndarray, count: int) -> list[dict[str, np.ndarray]]:
    """Feeds from a stack of named records (a data set of .npz files, one array per input name):
    each record is one whole feed, batch axis included."""
    values = model_inputs(model)
    fields = set(records.dtype.names)
    missing = [v.name for v in values if v.name not in fields]
    if missing:
        raise UserError(
            f"the data set's .npz files give {sorted(fields)}, but the model also needs input(s) {missing}"
        )
    extra = sorted(fields - {v.name for v in values})
    if extra:
        raise UserError(f"the data set's .npz files give {extra}, which the model has no input for")
    feeds = []
    for record in records[:count]:
        feed = {}
        for value in values:
            array = np.array(record[value.name])  # a 0-d field stays 0-d
            want = [int(d) for d in dims(value)]
            if list(array.shape) != want:
                raise UserError(
                    f"the data set's array '{value.name}' has shape {list(array.shape)}, but the model "
                    f"input expects {want}"
                )
            feed[value.name] = _conform(array, value, f"the data set's array '{value.name}'")
        feeds.append(feed)
    return feeds


def samples_for(model: onnx.ModelProto, tensors: np.ndarray, count: int) -> list[dict[str, np.ndarray]]:
    """At most `count` feed dicts from a prepared stack: named records (one per feed) for any
    model, or a [N, ...] stack of samples of the model's single input (`batch` samples a feed)."""
    if tensors.dtype.names:
        return _named_feeds(model, tensors, count)
    graph_inputs = model_inputs(model)
    if len(graph_inputs) != 1:
        raise UserError(
            f"the model has {len(graph_inputs)} inputs ({', '.join(i.name for i in graph_inputs)}); "
            "give a data set of .npz files with one array per input name"
        )
    value = graph_inputs[0]
    want = [int(d) for d in dims(value)]
    batch = want[0] if want else 1
    if list(tensors.shape[1:]) != want[1:]:
        raise UserError(
            f"the data set gives samples of shape {list(tensors.shape[1:])}, but model input "
            f"'{value.name}' expects {want} (a .npy is a stack [N, *input_shape[1:]]; for images "
            "check the dataset's preprocess.resize and layout)"
        )
    feeds = []
    for start in range(0, min(count * batch, len(tensors) - len(tensors) % batch), batch):
        array = np.ascontiguousarray(tensors[start : start + batch]).reshape(want)
        feeds.append({value.name: _conform(array, value, "the data set")})
    if not feeds:
        raise UserError(f"the data set has {len(tensors)} samples, fewer than one batch of {batch}")
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


def _feed_rows(model: onnx.ModelProto, tensors, count: int) -> list[tuple[int, int]]:
    """The rows [start, stop) of `tensors` that make each of the first `count` feeds."""
    if tensors.dtype.names:
        return [(k, k + 1) for k in range(min(count, len(tensors)))]
    values = model_inputs(model)
    want = [int(d) for d in dims(values[0])] if len(values) == 1 else []
    batch = want[0] if want else 1
    # At least one round, so that a data set that cannot feed the model says why.
    usable = max(batch, min(count * batch, len(tensors) - len(tensors) % batch))
    return [(start, start + batch) for start in range(0, usable, batch)]


def spread_indices(count: int, limit: int) -> list[int]:
    """All of range(count), or `limit` of them evenly spaced (the first and the last included)."""
    if count <= limit:
        return list(range(count))
    return sorted({int(i) for i in np.linspace(0, count - 1, limit)})


def feed_count(model: onnx.ModelProto, tensors) -> int:
    """How many feeds `tensors` makes for `model` (a batched input takes several rows each)."""
    return len(_feed_rows(model, tensors, len(tensors)))


def spread_feeds(model: onnx.ModelProto, tensors, limit: int) -> list[dict]:
    """All of `tensors`' feeds, or `limit` of them evenly spaced, the other rows not read."""
    count = feed_count(model, tensors)
    return list(iterate_feeds(model, tensors, count, only=set(spread_indices(count, limit))))


def iterate_feeds(model: onnx.ModelProto, tensors, count: int, only: Collection[int] | None = None):
    """Like samples_for, but yields one feed at a time (streaming); with `only`, just the feeds at
    those positions, the other rows not read."""
    for k, (start, stop) in enumerate(_feed_rows(model, tensors, count)):
        if only is not None and k not in only:
            continue
        if tensors.dtype.names:
            yield _named_feeds(model, tensors[start:stop], 1)[0]
        else:
            yield samples_for(model, tensors[start:stop], 1)[0]


def search_split(feeds: list) -> tuple[list, list]:
    """The evaluation samples a precision search may look at (even-numbered) and the ones it
    is judged on (odd-numbered, held out); a single sample is searched on and nothing is held out."""
    return feeds[0::2], feeds[1::2]
