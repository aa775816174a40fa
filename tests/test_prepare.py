"""prepare on real photographs and tensor files: modes, layouts, normalisation, .npy/.npz."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from conftest import PHOTOS
from npubuild.errors import UserError
from npubuild.stages import prepare

PHOTO = sorted((PHOTOS / "calib").glob("*.jpg"))[0]
DEFAULT = {
    "resize": [32, 48],
    "layout": "NCHW",
    "color": "RGB",
    "scale": 1 / 255,
    "mean": [0.0],
    "std": [1.0],
    "dtype": "float32",
}


def prepared(tmp_path, files: dict[str, bytes], **pp) -> tuple[np.ndarray, dict]:
    import json

    names = sorted(files)
    inputs = {}
    for i, name in enumerate(names):
        path = tmp_path / f"in{i}"
        path.write_bytes(files[name])
        inputs[f"src/{i:05d}"] = path
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    result = prepare.run({"files": names, "preprocess": {**DEFAULT, **pp}, "limit": None}, inputs, out)
    return np.load(result["tensors"]), json.loads(result["summary"].read_text())


def encoded(image: Image.Image, fmt: str = "PNG") -> bytes:
    import io

    buf = io.BytesIO()
    image.save(buf, format=fmt)
    return buf.getvalue()


def test_resize_layout_and_scale_match_pillow(tmp_path):
    tensors, summary = prepared(tmp_path, {"a.jpg": PHOTO.read_bytes()})
    expected = np.asarray(Image.open(PHOTO).convert("RGB").resize((48, 32), Image.BILINEAR), np.float32) / 255
    assert tensors.shape == (1, 3, 32, 48) and tensors.dtype == np.float32
    np.testing.assert_allclose(tensors[0], expected.transpose(2, 0, 1), atol=1e-6)
    assert summary["count"] == 1 and summary["sources"] == ["a.jpg"]


def test_bgr_nhwc_mean_std(tmp_path):
    rgb, _ = prepared(tmp_path, {"a.jpg": PHOTO.read_bytes()}, layout="NHWC")
    bgr, _ = prepared(
        tmp_path,
        {"a.jpg": PHOTO.read_bytes()},
        layout="NHWC",
        color="BGR",
        mean=[0.1, 0.2, 0.3],
        std=[0.5, 0.25, 2.0],
    )
    np.testing.assert_allclose(bgr[0], (rgb[0][..., ::-1] - [0.1, 0.2, 0.3]) / [0.5, 0.25, 2.0], atol=1e-5)


def test_grayscale_and_rgba_photos_become_rgb(tmp_path):
    photo = Image.open(PHOTO).convert("RGB")
    gray = photo.convert("L")
    rgba = photo.copy()
    rgba.putalpha(255)
    tensors, _ = prepared(tmp_path, {"a.png": encoded(photo), "b.png": encoded(gray), "c.png": encoded(rgba)})
    assert tensors.shape == (3, 3, 32, 48)
    np.testing.assert_array_equal(tensors[0], tensors[2])  # opaque RGBA == RGB
    assert np.all(tensors[1][0] == tensors[1][1])  # gray replicated to three channels


def test_gray_model_input_and_integer_dtypes(tmp_path):
    gray, _ = prepared(tmp_path, {"a.jpg": PHOTO.read_bytes()}, color="GRAY", dtype="uint8")
    assert gray.shape == (1, 1, 32, 48) and gray.dtype == np.uint8
    signed, _ = prepared(tmp_path, {"a.jpg": PHOTO.read_bytes()}, color="GRAY", dtype="int8")
    np.testing.assert_array_equal(signed.astype(np.int16), gray.astype(np.int16) - 128)


def test_npy_and_npz_are_taken_as_tensors(tmp_path):
    """A .npy and an .npz saved without names (arr_0, arr_1, ...) are stacks along axis 0; the
    dataset's dtype is applied. (An .npz with named arrays is one multi-input feed:
    tests/test_multi_input.py.)"""
    import io

    rng = np.random.default_rng(1)
    stack = rng.standard_normal((2, 3, 4, 5)).astype(np.float64)
    one = rng.standard_normal((3, 4, 5))
    npy, npz = io.BytesIO(), io.BytesIO()
    np.save(npy, stack)
    np.savez(npz, one[None], (one * 2)[None])
    tensors, summary = prepared(tmp_path, {"s.npy": npy.getvalue(), "t.npz": npz.getvalue()})
    assert tensors.shape == (4, 3, 4, 5) and tensors.dtype == np.float32
    np.testing.assert_allclose(tensors[:2], stack.astype(np.float32))
    np.testing.assert_allclose(tensors[3], (one * 2).astype(np.float32))  # arr_1 after arr_0
    assert summary["sources"] == ["s.npy", "s.npy", "t.npz", "t.npz"]


def test_different_sizes_without_resize_is_a_clear_error(tmp_path):
    small = encoded(Image.open(PHOTO).convert("RGB").resize((10, 10)))
    with pytest.raises(UserError, match="declare preprocess.resize"):
        prepared(tmp_path, {"a.jpg": PHOTO.read_bytes(), "b.png": small}, resize=None)


def test_nan_in_tensors_is_refused(tmp_path):
    import io

    buf = io.BytesIO()
    np.save(buf, np.array([[[np.nan]]], np.float32))
    with pytest.raises(UserError, match="NaN or Inf"):
        prepared(tmp_path, {"x.npy": buf.getvalue()})


def test_pickled_npy_is_refused(tmp_path):
    import io

    buf = io.BytesIO()
    np.save(buf, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(UserError, match="holds Python objects"):
        prepared(tmp_path, {"x.npy": buf.getvalue()})


def _npy(array: np.ndarray) -> bytes:
    import io

    buf = io.BytesIO()
    np.save(buf, array)
    return buf.getvalue()


def _zip_bomb() -> bytes:
    """An .npz whose one member claims a float32 array of 8 GiB and unpacks to 1.1 GiB of zeros:
    about a megabyte on disk."""
    import io
    import zipfile

    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        header, {"descr": "<f4", "fortran_order": False, "shape": (1 << 31,)}
    )
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=1) as archive:
        with archive.open("x.npy", "w", force_zip64=True) as member:
            member.write(header.getvalue())
            zeros = bytes(1 << 24)
            for _ in range(72):
                member.write(zeros)
    return buf.getvalue()


@pytest.mark.parametrize(
    "name, data, message",
    [
        ("empty.npy", _npy(np.zeros((0, 3), np.float32)), "the array is empty"),
        ("complex.npy", _npy(np.ones((1, 3, 2, 2), np.complex64)), "integer or float, got complex64"),
        ("text.npy", _npy(np.array([["a"]])), "integer or float"),
        ("zero-bytes.npy", b"", "not a .npy array"),
        ("garbage.npz", b"PK\x03\x04 not really a zip", "not a valid .npz"),
        ("garbage.npy", b"\x93NUMPY garbage", "not a .npy array"),
    ],
    ids=lambda value: value if isinstance(value, str) and len(value) < 40 else "",
)
def test_bad_tensor_files_are_one_clear_error(tmp_path, name, data, message):
    with pytest.raises(UserError, match=message):
        prepared(tmp_path, {name: data})


def test_an_npz_zip_bomb_is_refused_before_it_unpacks(tmp_path):
    import resource

    bomb = _zip_bomb()
    assert len(bomb) < 64 << 20
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(UserError, match="more than 1,073,741,824 bytes"):
        prepared(tmp_path, {"bomb.npz": bomb})
    assert (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024 < 256  # MiB


def _wide_photo() -> Image.Image:
    """A real photograph cropped to 2:1, so the aspect-keeping modes have something to keep."""
    im = Image.open(PHOTO).convert("RGB")
    w, h = im.size
    return im.crop((0, 0, w, w // 2)) if h > w // 2 else im.crop((0, 0, 2 * h, h))


def test_letterbox_keeps_the_aspect_and_pads_with_the_pad_value(tmp_path):
    photo = encoded(_wide_photo())
    centred, _ = prepared(
        tmp_path, {"a.png": photo}, resize=[64, 64], resize_mode="letterbox", pad_value=114, dtype="uint8"
    )
    rows = centred[0].transpose(1, 2, 0)  # [64, 64, 3]
    padded = np.all(rows == 114, axis=(1, 2))
    assert padded[:16].all() and padded[-16:].all()  # a 2:1 photo fills the middle 32 rows
    assert not padded[16:48].any()
    left, _ = prepared(
        tmp_path,
        {"a.png": photo},
        resize=[64, 64],
        resize_mode="letterbox",
        pad_value=0,
        pad_align="top_left",
        dtype="uint8",
    )
    assert np.all(left[0][:, 32:] == 0) and not np.all(left[0][:, :32] == 0)
    np.testing.assert_array_equal(left[0][:, :32], centred[0][:, 16:48])  # the same picture, moved


def test_short_side_scales_then_crops_the_centre(tmp_path):
    photo = _wide_photo()
    out, _ = prepared(
        tmp_path,
        {"a.png": encoded(photo)},
        resize=[32, 32],
        resize_mode="short_side",
        short_side=32,
        dtype="uint8",
    )
    # scaled to 64x32 then cropped to the middle 32 columns: Pillow's own resize, then the slice
    whole, _ = prepared(tmp_path, {"a.png": encoded(photo)}, resize=[32, 64], dtype="uint8")
    np.testing.assert_array_equal(out[0], whole[0][:, :, 16:48])
    with pytest.raises(Exception, match="needs resize"):
        from npubuild.rules.attrs import Preprocess

        Preprocess(resize_mode="letterbox")
