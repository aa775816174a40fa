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


def failure(stage: str, exc: Exception) -> dict:
    """The action's reply for an exception its stage raised (in this process or a child)."""
    if isinstance(exc, UserError):
        return {"status": "failed", "message": str(exc)}
    if isinstance(exc, MemoryError):
        # the model's tensors (times the samples a stage holds) outgrew what this process may
        # have: the input's size, said as such, not a bug of ours
        return {
            "status": "failed",
            "message": f"stage '{stage}' ran out of memory: the model's tensors need more than "
            "this machine (or its memory limit) allows",
        }
    # a bug of ours: say so in one line, keep the trace for --verbose
    return {
        "status": "failed",
        "message": f"internal error in stage '{stage}': {type(exc).__name__}: {exc}",
        "traceback": "".join(traceback.format_exception(exc)),
    }


class StageFailed(Exception):
    """The stage failed in the child process: `reply` is the action's reply, as `failure` made it
    there."""

    def __init__(self, reply: dict):
        super().__init__(reply["message"])
        self.reply = reply


def run_stage(
    module: str, stage: str, params: dict, inputs: dict[str, Path], outdir: Path
) -> dict[str, Path]:
    """`module.run(params, inputs, outdir)` in a child process: its outputs, or StageFailed with
    the reply for what the stage raised there, or a UserError naming the signal the child died of."""
    reply_path = outdir.parent / f"{outdir.name}.reply.json"
    request = {
        "module": module,
        "stage": stage,
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
        reply = {
            "failure": {
                "status": "failed",
                "message": f"internal error in stage '{stage}': the child process gave no reply: {tail}",
                "traceback": "\n".join(said),
            }
        }
    if "failure" in reply:
        raise StageFailed(reply["failure"])
    return {name: Path(path) for name, path in reply["produced"].items()}


def _main() -> None:
    request = json.loads(sys.stdin.buffer.read())
    from npubuild.engine.lifetime import bind_to_parent

    bind_to_parent(request["parent"], request["temp"])
    try:
        run = importlib.import_module(request["module"]).run
        inputs = {name: Path(path) for name, path in request["inputs"].items()}
        produced = run(request["params"], inputs, Path(request["outdir"]))
        reply = {"produced": {name: str(path) for name, path in produced.items()}}
    except Exception as exc:
        reply = {"failure": failure(request["stage"], exc)}
    Path(request["reply"]).write_text(json.dumps(reply))


if __name__ == "__main__":
    _main()
