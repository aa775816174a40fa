"""Run a .npub: NPU subgraphs in the simulator, CPU subgraphs in onnxruntime, in order.

Images go through in batches (the simulator runs one instruction for every image of a batch at
once); `run` is a batch of one. Values between subgraphs carry the images first."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import numpy as np
from pydantic import ValidationError

from npubuild.errors import one_line
from npubuild.intmodel.codes import dequantize, fits_integer
from npubuild.targets import npub
from npubuild.targets.isa import subgraph_program
from npubuild.targets.meta import Meta
from npubuild.targets.npub import NpubError
from npubuild.targets.sim_memory import DTYPES
from npubuild.targets.simulator import Simulator
from npubuild.targets.spec import target_digest

# ONNX element types a CPU subgraph's float-state input may have (TensorProto numbering)
_ONNX_DTYPES = {
    1: "float32",
    2: "uint8",
    3: "int8",
    4: "uint16",
    5: "int16",
    6: "int32",
    7: "int64",
    9: "bool",
    10: "float16",
    11: "float64",
    12: "uint32",
    13: "uint64",
}


def _fits(value: np.ndarray, want: np.dtype) -> bool:
    return value.dtype.kind in "iub" and want.kind in "iu" and fits_integer(value, want)


def onnx_dtype(code: int) -> np.dtype:
    if code not in _ONNX_DTYPES:
        raise NpubError(f"a CPU subgraph input has ONNX element type {code}, which the format does not list")
    return np.dtype(_ONNX_DTYPES[code])


def load(path: Path) -> npub.Npub:
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise NpubError(f"{path}: cannot read ({exc.strerror})") from None
    return npub.read(data, str(path))


def _check_self_contained(data: bytes, k: int) -> None:
    """A CPU subgraph must carry all its weights: onnxruntime would read external data relative to
    the working directory, so a binary could pull any file of the user's into its outputs."""
    import onnx

    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except Exception:  # protobuf's DecodeError and friends
        raise NpubError(f"subgraph {k}: the CPU model is not a valid ONNX protobuf") from None
    graphs = [model.graph]
    while graphs:
        graph = graphs.pop()
        tensors = list(graph.initializer)
        for node in graph.node:
            for attr in node.attribute:
                tensors.extend([attr.t, *attr.tensors])
                graphs.extend([attr.g, *attr.graphs])
        if any(t.data_location == onnx.TensorProto.EXTERNAL or t.external_data for t in tensors):
            raise NpubError(f"subgraph {k}: the CPU model refers to external data, which a .npub may not")


class Runtime:
    def __init__(self, binary: npub.Npub, batch: int = 1, threads: int = 1):
        self.binary = binary
        try:
            meta = Meta.model_validate(binary.meta)
        except ValidationError as exc:
            err = exc.errors()[0]
            where = ".".join(str(p) for p in err["loc"])
            raise NpubError(f"metadata: {where}: {err['msg']}") from None
        self.target = meta.target
        if target_digest(meta.target) != binary.target_digest:
            raise NpubError("the header's target digest does not match the target in the metadata")
        self.subgraphs = [sg.model_dump() for sg in meta.subgraphs]
        self.tensors = {k: t.model_dump() for k, t in meta.tensors.items()}
        self.inputs = [i.model_dump() for i in meta.inputs]
        self.outputs = list(meta.outputs)  # validated: each grid is a TensorQuant already
        constants = binary.constants
        if meta.constants_base + len(constants) > meta.dram_size:
            raise NpubError("metadata: DRAM layout does not hold the constants")
        self.programs = {}
        for k, sg in enumerate(self.subgraphs):
            if sg["device"] == "npu":
                self.programs[k] = subgraph_program(binary, sg, k)
            else:
                start, size = sg["model"]
                if start + size > len(binary.sections.get("cpu", b"")):
                    raise NpubError(f"subgraph {k}: CPU model outside the cpu section")
        self.batch = batch
        sram = meta.target.sram_kib * 1024
        self.sim = Simulator(sram, meta.dram_size, meta.target.model_dump(), batch, threads)
        base = meta.constants_base
        self.sim.dram.data[:, base : base + len(constants)] = np.frombuffer(constants, np.uint8)
        self.sim.dram.mark(base, base + len(constants), "constants")  # the same in every image
        self.sessions: dict[int, object] = {}

    def check_inputs(self, feeds: dict[str, np.ndarray]) -> None:
        for spec in self.inputs:
            name = spec["name"]
            if name not in feeds:
                raise NpubError(f"missing input '{name}' (shape {spec['shape']})")
            value = feeds[name]
            if list(value.shape) != list(spec["shape"]):
                raise NpubError(
                    f"input '{name}' has shape {list(value.shape)}; the model takes {spec['shape']}"
                )
            want = np.dtype(spec["dtype"])
            if want.kind == "f" and value.dtype.kind != "f":
                raise NpubError(f"input '{name}' has dtype {value.dtype}; the model takes {want}")
            if want.kind != "f" and (
                value.dtype.kind not in "iub"
                or not np.array_equal(value.astype(want).astype(value.dtype), value)
            ):
                raise NpubError(
                    f"input '{name}' has dtype {value.dtype}; the model takes {want} (ids, not values)"
                )

    def _session(self, k: int):
        if k not in self.sessions:
            import onnxruntime as ort

            start, size = self.subgraphs[k]["model"]
            data = self.binary.sections["cpu"][start : start + size]
            _check_self_contained(data, k)
            options = ort.SessionOptions()
            options.log_severity_level = 4  # its errors come back as one NpubError, not a log line
            try:
                # onnxruntime prints its provider fallback to stdout; the error below says it all
                with contextlib.redirect_stdout(io.StringIO()):
                    self.sessions[k] = ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])
            except Exception as exc:  # onnxruntime's own error types: the model is not one it runs
                raise NpubError(f"subgraph {k}: the CPU model does not load: {one_line(exc)}") from None
        return self.sessions[k]

    def run_npu(self, k: int, env: dict[str, np.ndarray]) -> None:
        """NPU subgraph k on the images of env ([images, *shape] values; at most `batch`)."""
        sg = self.subgraphs[k]
        images = len(next(iter(env.values()))) if env else 1
        self.sim.use_rows(0, images)
        for spec in sg["inputs"]:
            codes = np.asarray(env[spec["name"]]).astype(DTYPES[spec["bits"]])
            self.sim.dram.write(spec["dram"], spec["bits"], codes.reshape(images, *spec["shape"]))
        self.sim.execute(self.programs[k])
        for spec in sg["outputs"]:
            env[spec["name"]] = self.sim.dram.view(spec["dram"], spec["bits"], spec["shape"]).copy()

    def run_cpu(self, k: int, env: dict[str, np.ndarray]) -> None:
        """CPU subgraph k in onnxruntime, image by image (its model takes one)."""
        sg = self.subgraphs[k]
        images = len(next(iter(env.values())))
        feeds: list[dict[str, np.ndarray]] = [{} for _ in range(images)]
        for spec in sg["inputs"]:
            value = env[spec["name"]]
            if spec["state"] == "q":
                bits = 8 if spec["dtype"] == 3 else 16  # TensorProto.INT8 or INT16
                value = np.asarray(value).astype(DTYPES[bits])
            else:  # a float, or an integer input such as token ids
                value = np.asarray(value, onnx_dtype(spec["dtype"]))
            for feed, one in zip(feeds, value):
                feed[spec["value"]] = one
        names = [o["value"] for o in sg["outputs"]]
        results = [self._session(k).run(names, feed) for feed in feeds]
        for i, spec in enumerate(sg["outputs"]):
            env[spec["name"]] = np.stack([r[i] for r in results])

    def run(self, feeds: dict[str, np.ndarray], env: dict | None = None) -> dict[str, np.ndarray]:
        """The outputs for one image's `feeds`; a given `env` is filled with every subgraph's values."""
        batch_env: dict[str, np.ndarray] = {}
        outputs = self.run_batch([feeds], batch_env)[0]
        if env is not None:
            env.update({name: value[0] for name, value in batch_env.items()})
        return outputs

    def run_batch(
        self, feeds: list[dict[str, np.ndarray]], env: dict | None = None
    ) -> list[dict[str, np.ndarray]]:
        """The outputs of each image's feeds (at most `batch` images); a given `env` is filled with
        every subgraph's values, the images first."""
        if not 1 <= len(feeds) <= self.batch:
            raise ValueError(f"{len(feeds)} images for a runtime of batch {self.batch}")
        for one in feeds:
            self.check_inputs(one)
        dtypes = {spec["name"]: spec["dtype"] for spec in self.inputs}
        env = {} if env is None else env
        for name in feeds[0]:
            env[name] = np.stack([np.asarray(one[name], dtypes.get(name, "float32")) for one in feeds])
        for spec in self.inputs:
            if spec["pixels"]:  # the input DMA: uint8 pixels to int8 codes, pixel - 128
                env[spec["name"]] = (env[spec["name"]] ^ np.uint8(0x80)).view(np.int8)
        for k, sg in enumerate(self.subgraphs):
            try:
                with np.errstate(all="ignore"):  # a forged binary's NaNs are its own business
                    (self.run_npu if sg["device"] == "npu" else self.run_cpu)(k, env)
            except NpubError:
                raise
            except Exception as exc:  # inconsistent metadata, code or model that passed the checks
                where = f"subgraph {k} ({sg['device']})"
                raise NpubError(f"{where} cannot run: {type(exc).__name__}: {one_line(exc)}") from None
        outputs: list[dict[str, np.ndarray]] = [{} for _ in feeds]
        for spec in self.outputs:
            if spec.name not in env:
                raise NpubError(f"output '{spec.name}' is produced by no subgraph")
            for i, value in enumerate(env[spec.name]):
                if spec.quant and np.issubdtype(np.asarray(value).dtype, np.integer):
                    value = dequantize(np.asarray(value), spec.quant)
                outputs[i][spec.name] = np.asarray(value, np.float32)
        return outputs
