"""Fuzzers for the untrusted files npubuild reads itself: BUILD files, .npub binaries and models.

    python benchmarks/fuzz.py [--cases 2000] [--seed 0] [--which build,npub,model,qdq,qdq-exact]

BUILD cases are mutations of the example workspace's BUILD files (byte flips, cut and doubled
spans, inserted tokens and hostile snippets, splices), evaluated with the real rules. `.npub`
cases mutate a real binary (the small PP-OCR classifier, built on the fly) and reseal it, so the
section CRCs and the SHA-256 trailer are right and only the loader's own checks stand between the
bytes and the simulator: raw bytes of any section, or the metadata JSON edited structurally. Each
case is loaded and, when it loads, run on one input.

Model cases mutate the real PP-OCR classifier as a protobuf (attributes set to extremes or
dropped, initializers given other dims or element types or external data that points anywhere,
nodes dropped, rewired, retyped, the opset changed, outputs dropped or added) and build it in the
tests' small workspace, every stage to the simulator and the evaluation (`--cases` of these take
seconds each: a few hundred is a run). `qdq` and `qdq-exact` mutate the build's own QDQ export
instead, in its standard and its exact form: a pre-quantized model.

A case passes when it evaluates (or runs, or builds), or fails with the project's own error type
(UserError, NpubError; for a model, the build's error lines, none of them an internal error).
Anything else is a crash; a case past its deadline is a hang; the address
space is capped so that memory use is bounded too. Prints the tally; exit 1 on any crash or hang.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import re
import resource
import signal
import sys
import tempfile
import time
import traceback
import zlib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MEMORY_LIMIT = 6 << 30  # address space of this process: a case that tries for more fails


class _Hang(Exception):
    pass


@dataclass
class Tally:
    cases: int = 0
    ok: int = 0
    clean: int = 0
    crashes: list[str] = field(default_factory=list)
    hangs: list[int] = field(default_factory=list)
    messages: Counter = field(default_factory=Counter)

    def line(self, what: str) -> str:
        return (
            f"{what}: {self.cases} cases, {self.ok} accepted, {self.clean} clean errors, "
            f"{len(self.crashes)} crashes, {len(self.hangs)} hangs"
        )


def _run_case(tally: Tally, case: int, deadline_s: float, expected: tuple[type, ...], body) -> None:
    def alarm(signum, frame):
        raise _Hang

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, deadline_s)
    tally.cases += 1
    try:
        body()
        tally.ok += 1
    except _Hang:
        tally.hangs.append(case)
    except expected as exc:
        tally.clean += 1
        tally.messages[str(exc).split(":")[-1].strip()[:60]] += 1
    except Exception as exc:  # noqa: BLE001 - what the fuzzer is looking for
        last = traceback.extract_tb(exc.__traceback__)[-1]
        tally.crashes.append(
            f"case {case}: {type(exc).__name__}: {str(exc)[:120]} ({last.filename}:{last.lineno})"
        )
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


# BUILD files ----------------------------------------------------------------------------------

TOKENS = [
    "(",
    ")",
    "[",
    "]",
    "{",
    "}",
    ",",
    ":",
    "=",
    "+",
    "*",
    "%",
    "-",
    ".",
    '"',
    "'",
    "\n",
    "\t",
    " ",
    "\\",
    "#",
    "\x00",
    "é",
    "🚀",
    "None",
    "True",
    "[]",
    "{}",
    "0",
    "-1",
    "1e308",
    "9" * 40,
    "lambda x: x",
    "def f():\n  pass\n",
    "import os\n",
    "__class__",
    "__globals__",
    ".format(",
    "%s",
    "{}",
    "{0}",
    "{:>99}",
    "glob(",
    "pypi_file(",
    "dataset(",
    "npu_model(",
    "onnx_model(",
    "npu_target(",
    "for x in y:",
    "**",
    "if 1:",
    "while 1: pass\n",
    "print(",
    "open(",
    "exec(",
    "getattr(",
    "[i for i in range(9)]",
]

SNIPPETS = [
    'X = "{0.__init__.__globals__}".format(pypi_file(package="a", version="1", path="a", sha256="0"))',
    'X = "{0[__class__]}".format({})',
    'X = "{:99999999999}".format(1)',
    'X = "%*d" % (999999999, 1)',
    'X = "%0999999999d" % 1',
    "A = 7\n" + "A = A * A\n" * 12,
    'X = "".join(["x" * 100000] * 100000)',
    'A = "x" * 999999\n' + "A = A + A\n" * 8,
    "X = " + " + ".join(["1"] * 3000),
    "X = " + "[" * 300 + "]" * 300,
    "X = " + "-" * 5000 + "1",
    "X = " + "not " * 3000 + "1",
    'dataset(name = "' + "n" * 300 + '", srcs = [])',
    'onnx_model(name = "m", src = pypi_file(package = "--index-url=http://x", version = "1", path = "a", '
    'sha256 = "' + "0" * 64 + '"))',
    'dataset(name = "d", srcs = glob(["**", "../*", "/etc/*"]))',
    'dataset(name = "d", srcs = glob(["[", "**/**/**/*"]))',
    'npu_model(name = "x", model = "//' + "a/" * 200 + ':m", calibration = ":d")',
    "X = 1 / 0",
    'X = {"a": 1, "a": 2}',
    'X = "abc"[99]',
    "X = [1][True]",
    'X = "a".replace("a", "a" * 999999)',
    "X = (1, 2) * 999999999",
    'X = "a" * -1',
    "X = -9223372036854775808 * -1",
    "X = 1.5 * 10 ** 400",
]


VALUES = [
    '""',
    '"x"',
    "0",
    "-1",
    "2.5",
    "None",
    "True",
    "[]",
    "{}",
    '["a", 1]',
    '{"a": [1, {"b": None}]}',
    '"//pkg:name"',
    '":x"',
    '"//..."',
    '"vnpu-s"',
    '"../x"',
    '"/etc/passwd"',
    "9" * 30,
    '"{0}{1}"',
    'glob(["*"])',
    "[1] * 3",
    '"%s" % 1',
]
_LITERAL = re.compile(r'"[^"\n]*"|\b\d+(?:\.\d+)?\b|\[[^\[\]\n]*\]')


def _mutate_build(rng: random.Random, seeds: list[str]) -> str:
    text = rng.choice(seeds)
    if rng.random() < 0.5:  # keep it parseable: swap attribute values, so the rules get exercised
        literals = list(_LITERAL.finditer(text))
        for _ in range(rng.randint(1, 3)):
            if not literals:
                break
            m = rng.choice(literals)
            text = text[: m.start()] + rng.choice(VALUES) + text[m.end() :]
            literals = list(_LITERAL.finditer(text))
        return text
    for _ in range(rng.randint(1, 3)):
        kind = rng.randrange(6)
        at = rng.randrange(len(text) + 1)
        if kind == 0 and text:  # flip a character
            text = text[:at] + chr(rng.randrange(32, 127)) + text[at + 1 :]
        elif kind == 1:  # cut a span
            text = text[:at] + text[at + rng.randint(1, 40) :]
        elif kind == 2:  # double a span
            end = min(len(text), at + rng.randint(1, 80))
            text = text[:end] + text[at:end] + text[end:]
        elif kind == 3:
            text = text[:at] + rng.choice(TOKENS) + text[at:]
        elif kind == 4:  # a hostile statement on its own line
            lines = text.split("\n")
            lines.insert(rng.randrange(len(lines) + 1), rng.choice(SNIPPETS))
            text = "\n".join(lines)
        else:  # splice two files
            other = rng.choice(seeds)
            text = text[:at] + other[rng.randrange(len(other) + 1) :]
    return text


def fuzz_build(cases: int, seed: int, deadline_s: float = 10.0) -> Tally:
    from npubuild.buildlang import evaluate
    from npubuild.errors import UserError
    from npubuild.rules.registry import package_builtins

    seeds = [p.read_text() for p in sorted((REPO / "workspace_example").rglob("BUILD"))]
    seeds += [s + "\n" for s in SNIPPETS]
    rng = random.Random(seed)
    tally = Tally()
    with tempfile.TemporaryDirectory(prefix="npubuild-fuzz-") as tmp:
        package = Path(tmp) / "pkg"
        for rel in ("a.png", "b.jpg", "sub/c.npy", ".hidden.png"):
            (package / rel).parent.mkdir(parents=True, exist_ok=True)
            (package / rel).write_bytes(b"x")
        for case in range(cases):
            source = _mutate_build(rng, seeds)

            def body(source=source) -> None:
                evaluate(source, "pkg/BUILD", package_builtins("pkg", package, {}), Path(tmp), package)

            _run_case(tally, case, deadline_s, (UserError,), body)
    return tally


# .npub binaries -------------------------------------------------------------------------------


def _reseal(data: bytearray) -> bytes:
    """Recompute every section's CRC and the SHA-256 trailer, as a forger would."""
    from npubuild.targets import npub

    count = npub.HEADER.unpack_from(data)[5]
    for i in range(min(count, npub.MAX_SECTIONS)):
        at = npub.HEADER.size + npub.ENTRY.size * i
        if at + npub.ENTRY.size > len(data) - npub.TRAILER:
            break
        kind, flags, offset, length, _, extra = npub.ENTRY.unpack_from(data, at)
        payload = bytes(data[offset : offset + length])
        npub.ENTRY.pack_into(data, at, kind, flags, offset, length, zlib.crc32(payload), extra)
    body = bytes(data[: -npub.TRAILER])
    return body + hashlib.sha256(body).digest()


def _extreme(rng: random.Random, value):
    choices = [
        0,
        -1,
        1,
        2**31,
        2**40,
        2**63,
        -(2**63),
        10**30,
        1e308,
        -0.0,
        float("inf"),
        None,
        "",
        "x" * 1000,
        [],
        {},
    ]
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return rng.choice([value + 1, value - 1, value * 1000, *choices])
    if isinstance(value, float):
        return rng.choice([value * 1e6, -value, *choices])
    if isinstance(value, str):
        return rng.choice(["", value + "x", "🚀", "../../etc/passwd", *choices])
    if isinstance(value, list):
        if value and rng.random() < 0.5:
            copy = list(value)
            copy.pop(rng.randrange(len(copy)))
            return copy
        return rng.choice([[], value + value[:1], *choices])
    return rng.choice(choices)


def _mutate_meta(rng: random.Random, meta: dict) -> dict:
    meta = json.loads(json.dumps(meta))
    for _ in range(rng.randint(1, 3)):
        node, key = meta, None
        path = []
        while isinstance(node, (dict, list)) and node and rng.random() < 0.8:
            key = rng.choice(list(node)) if isinstance(node, dict) else rng.randrange(len(node))
            path.append((node, key))
            node = node[key]
        if not path:
            continue
        parent, key = path[-1]
        if isinstance(parent, dict) and rng.random() < 0.15:
            del parent[key]
        else:
            parent[key] = _extreme(rng, parent[key])
    return meta


def _mutate_npub(rng: random.Random, original: bytes) -> bytes:
    from npubuild.targets import npub

    binary = npub.read(original)
    if rng.random() < 0.5:
        forged = npub.Npub(
            binary.target_digest, _mutate_meta(rng, binary.meta), dict(binary.sections), binary.version
        )
        return npub.write(forged)
    data = bytearray(original)
    count = npub.HEADER.unpack_from(data)[5]
    i = rng.randrange(count)
    _, _, offset, length, _, _ = npub.ENTRY.unpack_from(data, npub.HEADER.size + npub.ENTRY.size * i)
    for _ in range(rng.randint(1, 8)):
        if rng.random() < 0.1:  # a header or section-table byte
            at = rng.randrange(npub.HEADER.size + npub.ENTRY.size * count)
        elif length:
            at = offset + rng.randrange(length)
        else:
            continue
        data[at] = rng.choice([0, 0xFF, 0x7F, 0x80, rng.randrange(256), data[at] ^ (1 << rng.randrange(8))])
    return _reseal(data)


def fuzz_npub(original: bytes, cases: int, seed: int, deadline_s: float = 30.0) -> Tally:
    import numpy as np

    from npubuild.errors import UserError
    from npubuild.targets import npub
    from npubuild.targets.runtime import Runtime

    rng = random.Random(seed)
    tally = Tally()
    for case in range(cases):
        data = _mutate_npub(rng, original)

        def body(data=data) -> None:
            runtime = Runtime(npub.read(data, "fuzz.npub"))
            feeds = {i["name"]: np.full(i["shape"], 0.5, np.float32) for i in runtime.inputs}
            runtime.run(feeds)

        _run_case(tally, case, deadline_s, (UserError,), body)
    return tally


def build_cls_binary(tmp: Path) -> bytes:
    """The small PP-OCR classifier workspace of the tests, built once: its model.npub."""
    from npubuild.cache.store import Store
    from npubuild.engine.run import build

    ws = _small_workspace(tmp)
    store = Store(tmp / "cache")
    try:
        outcome = build(ws, store, ["//models:cls_npu"])
        assert outcome.ok, outcome.errors
    finally:
        store.close()
    return (ws / "npubuild-out" / "models" / "cls_npu" / "model.npub").read_bytes()


# Models -------------------------------------------------------------------------------------

ONNX_OPS = ["Conv", "Relu", "Add", "Mul", "Reshape", "Transpose", "Concat", "Softmax", "MaxPool", "Gemm", "X"]
EXTERNAL_LOCATIONS = ["missing.bin", "../../../../etc/hostname", "/etc/hostname", "cls.onnx", "", "a\x00b"]


def _extreme_attribute(rng: random.Random, attribute) -> None:
    from onnx import AttributeProto

    if attribute.type == AttributeProto.INT:
        attribute.i = rng.choice([0, -1, 1 << 31, -(1 << 40), 3, 1 << 62])
    elif attribute.type == AttributeProto.INTS:
        values = list(attribute.ints) or [1]
        k = rng.randrange(len(values))
        values[k] = rng.choice([0, -1, 1 << 31, 10**6, 7])
        if rng.random() < 0.3:
            values = values[: rng.randrange(len(values) + 1)] + [rng.choice([0, 1, 5])] * rng.randint(0, 3)
        del attribute.ints[:]
        attribute.ints.extend(values)
    elif attribute.type == AttributeProto.FLOAT:
        attribute.f = rng.choice([float("nan"), float("inf"), -float("inf"), 0.0, 1e38, -1.0])
    elif attribute.type == AttributeProto.STRING:
        attribute.s = rng.choice([b"", b"NOTSET", b"\xff\xfe", b"SAME_UPPER" * 100])


def _mutate_model(rng: random.Random, original):
    """One to three mutations of a copy of `original` (an onnx.ModelProto)."""
    import onnx
    from onnx import TensorProto

    model = onnx.ModelProto()
    model.CopyFrom(original)
    graph = model.graph
    names = sorted({n for node in graph.node for n in (*node.input, *node.output) if n})
    for _ in range(rng.randint(1, 3)):
        kind = rng.randrange(10)
        node = graph.node[rng.randrange(len(graph.node))] if len(graph.node) else None
        if kind == 0 and node is not None and node.attribute:
            attribute = node.attribute[rng.randrange(len(node.attribute))]
            if rng.random() < 0.2:
                node.attribute.remove(attribute)
            else:
                _extreme_attribute(rng, attribute)
        elif kind == 1 and graph.initializer:
            tensor = graph.initializer[rng.randrange(len(graph.initializer))]
            if tensor.dims:
                k = rng.randrange(len(tensor.dims))
                tensor.dims[k] = rng.choice([0, 1, tensor.dims[k] * 2, tensor.dims[k] + 1, 1 << 40])
            else:
                tensor.dims.append(rng.choice([0, 2, 1 << 30]))
        elif kind == 2 and graph.initializer:
            tensor = graph.initializer[rng.randrange(len(graph.initializer))]
            tensor.data_type = rng.choice(
                [TensorProto.INT64, TensorProto.FLOAT16, TensorProto.STRING, TensorProto.UNDEFINED, 99]
            )
        elif kind == 3 and graph.initializer:
            tensor = graph.initializer[rng.randrange(len(graph.initializer))]
            tensor.data_location = TensorProto.EXTERNAL
            del tensor.external_data[:]
            entry = tensor.external_data.add()
            entry.key, entry.value = "location", rng.choice(EXTERNAL_LOCATIONS)
            if rng.random() < 0.5:
                entry = tensor.external_data.add()
                entry.key, entry.value = rng.choice(["offset", "length"]), str(rng.choice([-1, 0, 1 << 62]))
        elif kind == 4 and node is not None:
            graph.node.remove(node)
        elif kind == 5 and node is not None and node.input:
            k = rng.randrange(len(node.input))
            node.input[k] = rng.choice([*names, "no_such_tensor", ""])
        elif kind == 6 and node is not None:
            node.op_type = rng.choice(ONNX_OPS)
        elif kind == 7:
            model.opset_import[0].version = rng.choice([1, 6, 9, 11, 13, 17, 21, 99, -1])
        elif kind == 8 and graph.output:
            if rng.random() < 0.5:
                graph.output.remove(graph.output[rng.randrange(len(graph.output))])
            else:
                graph.output.add().name = rng.choice(names)
        elif kind == 9 and node is not None:
            node.output[0] = rng.choice([*names, node.input[0] if node.input else "x", ""])
    return model


class _BuildError(Exception):
    pass


def fuzz_model(
    ws: Path, cache: Path, cases: int, seed: int, deadline_s: float = 120.0, quantized: str = ""
) -> Tally:
    """Mutated models built in the tests' small workspace `ws` (its models/cls.onnx is
    overwritten) with the cache at `cache`; a case crashes when an error line says "internal
    error" or an exception escapes the build. With `quantized` ("standard" or "exact"), the
    mutations start from the build's own QDQ export in that form instead (a pre-quantized model as
    other tools write one: float ops between QuantizeLinear/DequantizeLinear pairs whose scales
    and zero points the mutations reach as initializers; the exact form adds float64 arithmetic,
    lookup tables as Gathers and 16-bit com.microsoft pairs)."""
    import onnx

    from npubuild.cache.store import Store
    from npubuild.engine.run import build

    path = ws / "models" / "cls.onnx"
    rng = random.Random(seed)
    tally = Tally()
    store = Store(cache)
    if quantized == "standard":
        build_file = ws / "models" / "BUILD"
        standard = 'npu_model(\n    quantize = {"qdq_export": "standard"},\n'
        build_file.write_text(build_file.read_text().replace("npu_model(\n", standard))
    try:
        build(ws, store, ["//models:cls_npu"])  # the data sets, once
        export = ws / "npubuild-out" / "models" / "cls_npu" / "quantized.qdq.onnx"
        source = export if quantized else path
        original = onnx.load(str(source))
        for case in range(cases):
            path.write_bytes(_mutate_model(rng, original).SerializeToString())

            def body() -> None:
                outcome = build(ws, store, ["//models:cls_npu"])
                if outcome.ok:
                    return
                internal = [e for e in outcome.errors if "internal error" in e]
                if internal:
                    raise RuntimeError(internal[0][:300])
                raise _BuildError(outcome.errors[0].replace(": ", " ", 2))  # keep the reason in the tally

            _run_case(tally, case, deadline_s, (_BuildError,), body)
    finally:
        store.close()
    return tally


# --which: the model fuzzer's seed model, a float one or one of our QDQ exports
QUANTIZED_FORMS = {"model": "", "qdq": "standard", "qdq-exact": "exact"}


def _small_workspace(tmp: Path) -> Path:
    sys.path.insert(0, str(REPO / "tests"))
    from conftest import CLS, make_small_ws
    from npubuild.stages import fetch

    return make_small_ws(tmp / "ws", fetch.run(CLS, {}, tmp)["model"])


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--which", default="build,npub,model,qdq,qdq-exact")
    args = parser.parse_args()
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))
    failed = False
    for which in args.which.split(","):
        started = time.perf_counter()
        if which == "build":
            tally = fuzz_build(args.cases, args.seed)
        elif which in QUANTIZED_FORMS:
            with tempfile.TemporaryDirectory(prefix="npubuild-fuzz-model-") as tmp:
                ws, cache = _small_workspace(Path(tmp)), Path(tmp) / "cache"
                tally = fuzz_model(ws, cache, args.cases, args.seed, quantized=QUANTIZED_FORMS[which])
        else:
            with tempfile.TemporaryDirectory(prefix="npubuild-fuzz-npub-") as tmp:
                original = build_cls_binary(Path(tmp))
            tally = fuzz_npub(original, args.cases, args.seed)
        print(f"{tally.line(which)} in {time.perf_counter() - started:.0f}s (seed {args.seed})")
        for message, count in tally.messages.most_common(8):
            print(f"    {count:5d}  {message}")
        for line in tally.crashes[:20]:
            print(f"  CRASH {line}")
        if tally.hangs:
            print(f"  HANGS cases {tally.hangs[:20]}")
        failed |= bool(tally.crashes or tally.hangs)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
