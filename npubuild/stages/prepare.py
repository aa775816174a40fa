"""prepare: decode a data set (images or .npy/.npz) and apply its declared preprocessing.

Images: decoded with Pillow, converted to RGB (grayscale, palette and RGBA become RGB) or to
one-channel GRAY, resized bilinearly to (height, width), optionally swapped to BGR; float dtypes
get x * scale, then (x - mean) / std; uint8 keeps raw pixels, int8 is pixels - 128.
.npy (and .npz saved without names): already tensors, a stack along axis 0 at any rank; only the
dtype is applied. An .npz with named arrays is one feed of a model with several inputs (token ids
and a mask, audio and a state): such data sets become one stack of records, a field per input.
The result is one .npy stack [N, ...] (deterministic bytes, memory-mappable).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from npubuild.errors import UserError
from npubuild.stages.feeds import read_npy_header
from npubuild.stages.onnx_utils import write_json


def _image(path: Path, rel: str, pp: dict) -> np.ndarray:
    from PIL import Image, UnidentifiedImageError

    if pp["dtype"] in ("int32", "int64"):
        raise UserError(
            f"{rel}: preprocess.dtype {pp['dtype']} is for tensor files; images are float or 8-bit"
        )

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
                im = _resized(im, pp)
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


def _resized(im, pp: dict):
    """The photo at (height, width) by the declared resize_mode (docs/build-language.md)."""
    from PIL import Image

    height, width = pp["resize"]
    mode = pp.get("resize_mode", "stretch")
    if mode == "stretch":
        return im.resize((width, height), Image.BILINEAR)
    w0, h0 = im.size
    if mode == "short_side":
        short = pp.get("short_side") or round(max(height, width) / 0.875)
        scale = short / min(w0, h0)
        nw, nh = max(width, round(w0 * scale)), max(height, round(h0 * scale))
        im = im.resize((nw, nh), Image.BILINEAR)
        left, top = (nw - width) // 2, (nh - height) // 2
        return im.crop((left, top, left + width, top + height))
    scale = min(width / w0, height / h0)  # letterbox: fit inside, pad the rest
    nw, nh = min(width, max(1, round(w0 * scale))), min(height, max(1, round(h0 * scale)))
    pad = pp.get("pad_value", 114)
    canvas = Image.new(im.mode, (width, height), pad if im.mode == "L" else (pad, pad, pad))
    at = ((width - nw) // 2, (height - nh) // 2) if pp.get("pad_align", "center") == "center" else (0, 0)
    canvas.paste(im.resize((nw, nh), Image.BILINEAR), at)
    return canvas


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


_POSITIONAL = re.compile(r"arr_[0-9]+")


def _arrays(path: Path, rel: str) -> dict[str, np.ndarray]:
    """The arrays of a .npy (one, keyed '') or a .npz (by member name), checked first."""
    _check_file(path, rel)
    try:
        if not rel.lower().endswith(".npz"):
            return {"": np.load(path, allow_pickle=False)}
        with np.load(path, allow_pickle=False) as loaded:
            keys = sorted(loaded.files)
            if all(_POSITIONAL.fullmatch(k) for k in keys):  # arr_2 before arr_10, as saved
                keys.sort(key=lambda k: int(k[4:]))
            return {k: loaded[k] for k in keys}
    except (ValueError, OSError, EOFError) as exc:
        raise UserError(f"{rel}: cannot read tensors ({exc})") from None


def _tensors(path: Path, rel: str, dtype: str) -> list[np.ndarray | dict[str, np.ndarray]]:
    """Samples of one tensor file. A .npy (or an .npz saved without names, arr_0, arr_1, ...)
    is a stack: axis 0 counts samples at any rank, and the dataset's dtype is applied. An .npz
    with named arrays is one whole feed of a model with those input names, dtypes kept."""
    arrays = _arrays(path, rel)
    if all(k == "" or _POSITIONAL.fullmatch(k) for k in arrays):
        samples: list[np.ndarray | dict[str, np.ndarray]] = []
        for key, a in arrays.items():
            if a.ndim == 0:
                raise UserError(f"{rel}{f'[{key}]' if key else ''}: a 0-d array is no stack; save x[None]")
            samples.extend(np.ascontiguousarray(s.astype(dtype)) for s in a)
        return samples
    return [{k: np.ascontiguousarray(a) for k, a in arrays.items()}]


def _records(samples: list[dict[str, np.ndarray]], sources: list[str]) -> np.ndarray:
    """Named feeds as one structured stack: a field per input name (its own dtype and shape), so
    the stack stays one plain .npy that streams a record at a time."""
    first = samples[0]
    layout = {k: (a.dtype, a.shape) for k, a in first.items()}
    for k, sample in enumerate(samples):
        got = {name: (a.dtype, a.shape) for name, a in sample.items()}
        if got != layout:
            raise UserError(
                f"{sources[k]}: its arrays differ from {sources[0]}'s "
                f"({_describe(got)} vs {_describe(layout)}); every .npz of a data set gives the same "
                "names, shapes and dtypes"
            )
    records = np.zeros(len(samples), dtype=[(name, dt, shape) for name, (dt, shape) in layout.items()])
    for k, sample in enumerate(samples):
        for name, a in sample.items():
            records[k][name] = a
    return records


def _describe(layout: dict) -> str:
    return ", ".join(f"{name} {dt} {list(shape)}" for name, (dt, shape) in layout.items())


def _fields(stack: np.ndarray) -> list[np.ndarray]:
    return [stack[name] for name in stack.dtype.names] if stack.dtype.names else [stack]


def run(params: dict, inputs: dict[str, Path], outdir: Path) -> dict[str, Path]:
    pp = params["preprocess"]
    files: list[str] = params["files"]
    samples: list = []
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
    named = [isinstance(s, dict) for s in samples]
    if any(named) and not all(named):
        k = named.index(not named[0])
        raise UserError(
            f"{sources[k]} and {sources[0]}: a data set is either named .npz feeds or tensors and "
            "images, not both"
        )
    if all(named):
        stack = _records(samples, sources)
    else:
        odd = next((k for k, s in enumerate(samples) if s.shape != samples[0].shape), None)
        if odd is not None:
            raise UserError(
                f"samples differ in shape ({sources[0]}: {list(samples[0].shape)}, "
                f"{sources[odd]}: {list(samples[odd].shape)}); declare preprocess.resize"
            )
        stack = np.stack(samples)
    values = [f.astype(np.float64) for f in _fields(stack)]
    if not all(np.isfinite(v).all() for v in values):
        raise UserError("the data set contains NaN or Inf values")
    np.save(outdir / "tensors.npy", stack, allow_pickle=False)
    summary = {
        "count": int(stack.shape[0]),
        "sample_shape": list(stack.shape[1:]),
        "dtype": str(stack.dtype) if not stack.dtype.names else "records",
        "sources": sources,
        "min": min(float(v.min()) for v in values),
        "max": max(float(v.max()) for v in values),
        "mean": float(np.mean([v.mean() for v in values])),
        "warnings": [],
    }
    if stack.dtype.names:
        summary["inputs"] = {
            n: [str(stack.dtype[n].base), list(stack.dtype[n].shape)] for n in stack.dtype.names
        }
    return {"tensors": outdir / "tensors.npy", "summary": write_json(outdir / "manifest.json", summary)}
