"""prepare: decode a data set (images or .npy/.npz) and apply its declared preprocessing.

Images: decoded with Pillow, converted to RGB (grayscale, palette and RGBA become RGB) or to
one-channel GRAY, resized bilinearly to (height, width), optionally swapped to BGR; float dtypes
get x * scale, then (x - mean) / std; uint8 keeps raw pixels, int8 is pixels - 128.
.npy/.npz: already tensors; a 4-D array is a stack of samples, anything else one sample; only the
dtype is applied. The result is one .npy stack [N, ...] (deterministic bytes, memory-mappable).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from npubuild.errors import UserError
from npubuild.stages.feeds import read_npy_header
from npubuild.stages.onnx_utils import write_json


def _image(path: Path, rel: str, pp: dict) -> np.ndarray:
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as im:
            im.load()
            mode = "L" if pp["color"] == "GRAY" else "RGB"
            if im.mode in ("RGBA", "LA", "P") and mode == "RGB":
                # Composite transparency on black, so RGBA and RGB copies of a photo agree.
                im = im.convert("RGBA")
                background = Image.new("RGBA", im.size, (0, 0, 0, 255))
                im = Image.alpha_composite(background, im)
            im = im.convert(mode)
            if pp["resize"]:
                height, width = pp["resize"]
                im = im.resize((width, height), Image.BILINEAR)
            pixels = np.asarray(im, dtype=np.uint8)
    except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError) as exc:
        raise UserError(f"{rel}: cannot decode image ({type(exc).__name__}: {exc})") from None
    if pixels.ndim == 2:
        pixels = pixels[:, :, None]
    if pp["color"] == "BGR":
        pixels = pixels[:, :, ::-1]
    dtype = pp["dtype"]
    if dtype == "uint8":
        array = pixels.copy()
    elif dtype == "int8":
        array = (pixels.astype(np.int16) - 128).astype(np.int8)
    else:
        x = pixels.astype(np.float32) * np.float32(pp["scale"])
        mean = np.asarray(pp["mean"], dtype=np.float32)
        std = np.asarray(pp["std"], dtype=np.float32)
        array = ((x - mean) / std).astype(dtype)
    if pp["layout"] == "NCHW":
        array = array.transpose(2, 0, 1)
    return np.ascontiguousarray(array)


# What one data file may unpack to: far more than a calibration set needs, far less than the machine.
MAX_TENSOR_BYTES = 1 << 30


def _check_header(f, what: str) -> int:
    """Read a .npy header and refuse what we will not load: object (pickle), complex, bool or
    string arrays, empty arrays, and more than MAX_TENSOR_BYTES. Returns the array's bytes."""
    try:
        shape, _, dtype = read_npy_header(f)
    except (ValueError, OSError, EOFError) as exc:
        raise UserError(f"{what}: not a .npy array ({exc})") from None
    if dtype.hasobject:
        raise UserError(f"{what}: holds Python objects (a pickle); save plain numeric arrays")
    if dtype.kind not in "iuf":
        raise UserError(f"{what}: tensors must be integer or float, got {dtype}")
    count = int(np.prod(shape, dtype=np.int64)) if shape else 1
    if count == 0:
        raise UserError(f"{what}: the array is empty (shape {list(shape)})")
    size = count * dtype.itemsize
    if size > MAX_TENSOR_BYTES:
        raise UserError(f"{what}: the array holds {size:,} bytes, more than {MAX_TENSOR_BYTES:,}")
    return size


def _check_file(path: Path, rel: str) -> None:
    """Every array of a .npy or .npz, checked before anything is unpacked (an .npz is a zip: a
    few megabytes can claim gigabytes)."""
    import zipfile

    if not rel.lower().endswith(".npz"):
        with open(path, "rb") as f:
            _check_header(f, rel)
        return
    try:
        with zipfile.ZipFile(path) as archive:
            members = archive.infolist()
            if sum(m.file_size for m in members) > MAX_TENSOR_BYTES:
                raise UserError(f"{rel}: unpacks to more than {MAX_TENSOR_BYTES:,} bytes")
            for member in members:
                with archive.open(member) as f:  # reads at most the declared file_size
                    _check_header(f, f"{rel}[{member.filename}]")
    except (zipfile.BadZipFile, OSError, EOFError) as exc:
        raise UserError(f"{rel}: not a valid .npz archive ({exc})") from None


def _tensors(path: Path, rel: str, dtype: str) -> list[np.ndarray]:
    _check_file(path, rel)
    try:
        loaded = np.load(path, allow_pickle=False)
        arrays = [loaded[k] for k in sorted(loaded.files)] if hasattr(loaded, "files") else [loaded]
    except (ValueError, OSError, EOFError) as exc:
        raise UserError(f"{rel}: cannot read tensors ({exc})") from None
    samples: list[np.ndarray] = []
    for a in arrays:
        samples.extend(list(a) if a.ndim == 4 else [a])
    return [np.ascontiguousarray(s.astype(dtype)) for s in samples]


def run(params: dict, inputs: dict[str, Path], outdir: Path) -> dict[str, Path]:
    pp = params["preprocess"]
    files: list[str] = params["files"]
    samples: list[np.ndarray] = []
    sources: list[str] = []
    for i, rel in enumerate(files):
        if params["limit"] is not None and len(samples) >= params["limit"]:
            break
        path = inputs[f"src/{i:05d}"]
        new = (
            _tensors(path, rel, pp["dtype"])
            if rel.lower().endswith((".npy", ".npz"))
            else [_image(path, rel, pp)]
        )
        samples.extend(new)
        sources.extend([rel] * len(new))
    if params["limit"] is not None:
        samples, sources = samples[: params["limit"]], sources[: params["limit"]]
    if not samples:
        raise UserError("the data set has no samples")
    odd = next((k for k, s in enumerate(samples) if s.shape != samples[0].shape), None)
    if odd is not None:
        raise UserError(
            f"samples differ in shape ({sources[0]}: {list(samples[0].shape)}, "
            f"{sources[odd]}: {list(samples[odd].shape)}); declare preprocess.resize"
        )
    stack = np.stack(samples)
    if not np.isfinite(stack.astype(np.float64)).all():
        raise UserError("the data set contains NaN or Inf values")
    np.save(outdir / "tensors.npy", stack, allow_pickle=False)
    summary = {
        "count": int(stack.shape[0]),
        "sample_shape": list(stack.shape[1:]),
        "dtype": str(stack.dtype),
        "sources": sources,
        "min": float(stack.min()),
        "max": float(stack.max()),
        "mean": float(stack.astype(np.float64).mean()),
        "warnings": [],
    }
    return {"tensors": outdir / "tensors.npy", "summary": write_json(outdir / "manifest.json", summary)}
