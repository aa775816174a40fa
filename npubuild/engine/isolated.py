"""A stage that first parses a file from outside with native code runs in a child process.

onnx's shape inference aborts its process on some malformed models (an assertion in the data
propagation of a Slice whose "shape" input is a feature map: `benchmarks/fuzz.py --which model`,
seed 31, 2026-11-28). In the build's own process (`-j 1`) that ended the build with a C++
assertion and no line of ours; in a pool worker it broke the pool, and the other actions in flight
failed with "worker died". In a child, the crash is this action's failure, said in one line, and
nothing else is touched. The child runs the stage's own `run` on the same paths; its reply (what
it produced, or the error the stage raised) comes back as JSON in a file beside the stage's
output directory, since libraries write to stdout.
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path

from npubuild.errors import UserError


class ChildInternalError(Exception):
    """An exception of ours in the child's stage: its description and traceback, kept as the
    child gave them."""

    def __init__(self, description: str, trace: str):
        super().__init__(description)
        self.description = description
        self.trace = trace


def run_stage(
    module: str, stage: str, params: dict, inputs: dict[str, Path], outdir: Path
) -> dict[str, Path]:
    """`module.run(params, inputs, outdir)` in a child process: its outputs, or the same errors
    it raises (UserError, MemoryError; ChildInternalError for any other exception), or a
    UserError naming the signal when the child dies of one."""
    reply_path = outdir.parent / f"{outdir.name}.reply.json"
    request = {
        "module": module,
        "params": params,
        "inputs": {name: str(path) for name, path in inputs.items()},
        "outdir": str(outdir),
        "reply": str(reply_path),
        "parent": os.getpid(),
        "temp": tempfile.gettempdir(),
    }
    package_root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH", "")) if p)
    child = subprocess.run(
        [sys.executable, "-m", "npubuild.engine.isolated"],
        input=json.dumps(request).encode(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
        check=False,
    )
    said = [line for line in child.stderr.decode(errors="replace").splitlines() if line.strip()]
    if child.returncode == -signal.SIGKILL:  # the kernel's out-of-memory killer, or a user
        raise UserError(f"stage '{stage}' was killed (SIGKILL: out of memory, or killed from outside)")
    if child.returncode < 0:
        name = signal.Signals(-child.returncode).name
        # the library's last word (a C++ assertion's text, past its source path), if any
        last = f" ({said[-1].rsplit(': ', 1)[-1].strip()[:200]})" if said else ""
        raise UserError(
            f"stage '{stage}' crashed with {name} in native code reading this input{last}: the "
            "file is malformed in a way the library's own checks do not catch"
        )
    try:
        reply = json.loads(reply_path.read_text())
    except (OSError, ValueError):
        tail = said[-1].strip()[:300] if said else f"exit status {child.returncode}"
        raise ChildInternalError(f"the child process gave no reply: {tail}", "\n".join(said)) from None
    if reply["kind"] == "ok":
        return {name: Path(path) for name, path in reply["produced"].items()}
    if reply["kind"] == "user":
        raise UserError(reply["message"])
    if reply["kind"] == "memory":
        raise MemoryError
    raise ChildInternalError(reply["message"], reply["traceback"])


def _main() -> None:
    request = json.loads(sys.stdin.buffer.read())
    from npubuild.engine.lifetime import bind_to_parent

    bind_to_parent(request["parent"], request["temp"])
    try:
        run = importlib.import_module(request["module"]).run
        inputs = {name: Path(path) for name, path in request["inputs"].items()}
        produced = run(request["params"], inputs, Path(request["outdir"]))
        reply = {"kind": "ok", "produced": {name: str(path) for name, path in produced.items()}}
    except UserError as exc:
        reply = {"kind": "user", "message": str(exc)}
    except MemoryError:
        reply = {"kind": "memory"}
    except Exception as exc:  # a bug of ours: the parent reports it as in-process
        reply = {
            "kind": "internal",
            "message": f"{type(exc).__name__}: {exc}",
            "traceback": traceback.format_exc(),
        }
    Path(request["reply"]).write_text(json.dumps(reply))


if __name__ == "__main__":
    _main()
