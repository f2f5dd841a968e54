"""Bad input through the public entry points: ``xmesh.reconstruct``, ``xmesh.Reconstructor`` and the CLI.

Every bad input must raise an ``xmesh.errors.XmeshError`` subclass (the CLI: print
``xmesh <cmd>: error: ...`` and return 2) whose message names the file or argument and says what is
expected, and it must do so while validating, before any network compute: the module-wide guard
below makes ``network.run_network`` fail loudly, and the one-shot API and the CLI get a weights path
that does not exist, so an input that is not checked before the weights are loaded shows up as the
wrong error. The last part checks that interrupted writes leave the previous output intact.
"""

from __future__ import annotations

import base64
import contextlib
import os
import pickle
import shutil
import struct
import zlib
from pathlib import Path

import cv2
import numpy as np
import pytest

import xmesh
from xmesh.cli import main
from xmesh.errors import ChecksumError, FileFormatError, InputError, MissingFileError, WeightsError, XmeshError
from xmesh.io import safe_pickle
from xmesh.io.images import load_images
from xmesh.io.weights import synthetic_weights
from xmesh.mesh import Mesh, read_obj, read_ply, read_xyz
from xmesh.model import network

SUBSET = "meshnet_subset.ckpt-5"
SHARD = f"{SUBSET}.data-00000-of-00001"
NO_WEIGHTS = "/nonexistent/xmesh-weights.npz"  # reached only if validation let a bad input through


# ----------------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def weights():
    return synthetic_weights(1)


@pytest.fixture(scope="module")
def model(weights):
    return xmesh.Reconstructor(weights)


@pytest.fixture(autouse=True)
def no_compute(monkeypatch):
    """Any bad input must be refused before the network runs."""

    def forbidden(*args, **kwargs):
        raise AssertionError("network.run_network was reached: the input was not validated before compute")

    monkeypatch.setattr(network, "run_network", forbidden)


@pytest.fixture(scope="module")
def demo_files(demo_dir):
    return [str(demo_dir / f"plane{i}.png") for i in (1, 2, 3)], str(demo_dir / "cameras.txt")


@pytest.fixture()
def ckpt(golden_dir, tmp_path) -> Path:
    """A writable copy of the TensorFlow-written stage-2 subset checkpoint."""
    folder = tmp_path / "ckpt"
    folder.mkdir()
    for name in (f"{SUBSET}.index", SHARD, "checkpoint"):
        shutil.copy(golden_dir / "tf_ckpt" / name, folder / name)
        (folder / name).chmod(0o644)
    return folder / SUBSET


@pytest.fixture(scope="module")
def template_dict(golden_dir):
    return safe_pickle.load(golden_dir / "template.dat")


def cli_error(capsys, argv) -> str:
    """Run the CLI, check it failed cleanly (rc 2, one 'xmesh CMD: error:' line, no traceback); the message."""
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "Traceback" not in err
    head = f"xmesh {argv[0]}: error: "
    assert head in err, err
    message = err.split(head, 1)[1]
    assert message.count("\n") == 1 and message.endswith("\n"), f"not one line:\n{message}"
    return message


def check_message(message: str, *parts: str) -> None:
    for part in parts:
        assert part in message, f"{part!r} not in the message:\n{message}"


def run_entry(entry, images, cameras, capsys, model, tmp_path, views=None, extra=()):
    """Feed one bad input through an entry point; return (error class name, message)."""
    if entry == "cli":
        argv = [
            "reconstruct",
            *images,
            "--cameras",
            str(cameras),
            "--out",
            str(tmp_path / "m.obj"),
            "--weights",
            NO_WEIGHTS,
            *extra,
        ]
        if views is not None:
            argv += ["--views", *map(str, views)]
        message = cli_error(capsys, argv)
        assert not (tmp_path / "m.obj").exists()
        return None, message
    with pytest.raises(XmeshError) as info:
        if entry == "api":
            xmesh.reconstruct(images, cameras, weights=NO_WEIGHTS, views=views)
        else:
            model(images, cameras, views=views)
    return type(info.value), str(info.value)


ENTRIES = ("api", "model", "cli")
ARRAY_ENTRIES = ("api", "model")


# ----------------------------------------------------------------------------------- image files


def _bad_image(kind: str, tmp_path: Path, demo_dir: Path) -> Path:
    real = (demo_dir / "plane1.png").read_bytes()
    path = tmp_path / f"bad_{kind}.png"
    if kind == "missing":
        pass
    elif kind == "directory":
        path.mkdir()
    elif kind == "corrupt":
        path.write_bytes(np.random.default_rng(0).integers(0, 256, 3000, dtype=np.uint8).tobytes())
    elif kind == "truncated":
        path.write_bytes(real[: len(real) // 3])
    elif kind == "header_only":
        path.write_bytes(real[:33])  # signature + IHDR, no image data
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "text":
        path.write_text("this is not a picture\n")
    return path


IMAGE_FILE_CASES = {
    "missing": (MissingFileError, "does not exist"),
    "directory": (InputError, "is a directory; expected an image file"),
    "corrupt": (FileFormatError, "could not be decoded"),
    "truncated": (FileFormatError, "could not be decoded"),
    "header_only": (FileFormatError, "could not be decoded"),
    "empty": (FileFormatError, "is empty"),
    "text": (FileFormatError, "could not be decoded"),
}


@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize("kind", sorted(IMAGE_FILE_CASES))
def test_bad_image_file(kind, entry, demo_files, demo_dir, tmp_path, capsys, model):
    images, cameras = demo_files
    bad = _bad_image(kind, tmp_path, demo_dir)
    cls, message = run_entry(entry, [images[0], str(bad), images[2]], cameras, capsys, model, tmp_path)
    want_cls, want_text = IMAGE_FILE_CASES[kind]
    if cls is not None:
        assert cls is want_cls
    check_message(message, f"bad_{kind}.png", want_text, "expected")


@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize("count", [1, 2, 4])
def test_wrong_number_of_views(count, entry, demo_files, tmp_path, capsys, model):
    images, cameras = demo_files
    paths = (images * 2)[:count]
    cls, message = run_entry(entry, paths, cameras, capsys, model, tmp_path)
    check_message(message, f"got {count} images", "3 views")


@pytest.mark.parametrize("entry", ARRAY_ENTRIES)
@pytest.mark.parametrize("count", [2, 4])
def test_wrong_number_of_views_array(count, entry, demo_files, tmp_path, capsys, model):
    _, cameras = demo_files
    cls, message = run_entry(entry, np.zeros((count, 224, 224, 3), np.float32), cameras, capsys, model, tmp_path)
    assert cls is InputError
    check_message(message, "images array", f"holds {count} views", "3 views are needed")


def test_single_path_is_not_three_views(model, demo_files):
    images, cameras = demo_files
    with pytest.raises(InputError, match="got a single path .* pass a sequence of 3 paths"):
        model(images[0], cameras)


# ----------------------------------------------------------------------------------- image arrays

GOOD = np.full((224, 224, 3), 0.5, np.float32)


def _net(value, dtype) -> np.ndarray:
    return np.full((3, 224, 224, 3), value, dtype=dtype)


def _item(array) -> list:
    return [GOOD, array, GOOD]


def _object_array():
    arr = np.empty((8, 8, 3), dtype=object)
    arr[...] = 0.5
    return arr


ARRAY_CASES = {
    # name: (images, text that must be in the message)
    "net_3d": (
        np.zeros((3, 224, 224), np.float32),
        ["images array has shape (3, 224, 224)", "expected (3, 224, 224, 3)"],
    ),
    "net_5d": (np.zeros((1, 3, 224, 224, 3), np.float32), ["images array has shape (1, 3, 224, 224, 3)", "expected"]),
    "net_4ch": (np.zeros((3, 224, 224, 4), np.float32), ["shape (3, 224, 224, 4)", "expected (3, 224, 224, 3)"]),
    "net_small": (np.zeros((3, 112, 112, 3), np.float32), ["shape (3, 112, 112, 3)", "expected (3, 224, 224, 3)"]),
    "net_complex": (_net(0.5, np.complex64), ["images array has dtype complex64", "expected float in [0, 1]"]),
    "net_object": (_net(0.5, object), ["images array has dtype object", "expected float in [0, 1]"]),
    "net_bool": (_net(True, bool), ["images array has dtype bool", "expected float in [0, 1]"]),
    "net_above_1": (_net(1.5, np.float32), ["values span [1.5, 1.5]", "expected BGR values in [0, 1]"]),
    "net_below_0": (_net(-0.25, np.float64), ["values span [-0.25, -0.25]", "expected BGR values in [0, 1]"]),
    "net_int_255": (_net(255, np.int32), ["values span [255, 255]", "expected BGR values in [0, 1]"]),
    "net_nan": (
        np.where(np.arange(3)[:, None, None, None] == 1, np.nan, _net(0.5, np.float32)),
        ["images array holds NaN or infinite", "expected finite values in [0, 1]"],
    ),
    "net_inf": (_net(np.inf, np.float32), ["NaN or infinite", "expected finite values"]),
    "item_5ch": (_item(np.zeros((10, 10, 5), np.float32)), ["image 1", "shape (10, 10, 5)", "expected (H, W) gray"]),
    "item_1d": (_item(np.zeros(10, np.float32)), ["image 1", "shape (10,)", "expected"]),
    "item_4d": (_item(np.zeros((2, 10, 10, 3), np.float32)), ["image 1", "shape (2, 10, 10, 3)", "expected"]),
    "item_empty": (_item(np.zeros((0, 10, 3), np.uint8)), ["image 1", "at least 1x1"]),
    "item_complex": (_item(np.full((8, 8, 3), 0.5, np.complex128)), ["image 1", "complex128", "expected uint8"]),
    "item_object": (_item(_object_array()), ["image 1", "dtype object is not numeric", "expected uint8"]),
    "item_bool": (_item(np.ones((8, 8, 3), bool)), ["image 1", "dtype bool", "expected uint8"]),
    "item_int64": (_item(np.ones((8, 8, 3), np.int64)), ["image 1", "int64 is not supported", "expected uint8"]),
    "item_above_1": (
        _item(np.full((8, 8, 3), 2.0, np.float32)),
        ["image 1", "span [0, 2]", "expected values in [0, 1]"],
    ),
    "item_below_0": (
        _item(np.full((8, 8, 3), -1.0, np.float64)),
        ["image 1", "span [-1, 0]", "expected values in [0, 1]"],
    ),
    "item_nan": (_item(np.full((8, 8, 3), np.nan, np.float32)), ["image 1", "NaN or infinite", "expected finite"]),
    "item_inf": (_item(np.full((8, 8, 3), -np.inf, np.float16)), ["image 1", "NaN or infinite", "expected finite"]),
    "item_not_array": (_item(12345), ["image 1 is a int", "expected a path or an (H, W, 3) array"]),
    "not_a_sequence": (42, ["images of type int", "expected a sequence of 3"]),
}


@pytest.mark.parametrize("entry", ARRAY_ENTRIES)
@pytest.mark.parametrize("case", sorted(ARRAY_CASES))
def test_bad_image_array(case, entry, demo_files, tmp_path, capsys, model):
    images, parts = ARRAY_CASES[case]
    cls, message = run_entry(entry, images, demo_files[1], capsys, model, tmp_path)
    assert cls is InputError
    check_message(message, *parts)


# ------------------------------------------------------------------- odd but valid image files


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def raw_png(pixels: np.ndarray, color_type: int, extra: bytes = b"") -> bytes:
    """An 8-bit PNG written by hand, for layouts OpenCV does not write (palette: 3, gray + alpha: 4)."""
    h, w = pixels.shape[:2]
    raw = b"".join(b"\x00" + row.astype(np.uint8).tobytes() for row in pixels)
    out = b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, color_type, 0, 0, 0))
    return out + extra + _png_chunk(b"IDAT", zlib.compress(raw)) + _png_chunk(b"IEND", b"")


def paletted_png(indices: np.ndarray, palette: list, transparent: list | None = None) -> bytes:
    chunks = _png_chunk(b"PLTE", bytes(c for rgb in palette for c in rgb))
    if transparent is not None:
        chunks += _png_chunk(b"tRNS", bytes(transparent))
    return raw_png(indices, 3, chunks)


# An 8x8 Adobe CMYK JPEG of pure red (C=0, M=255, Y=255, K=0), 354 bytes, made once with Pillow.
CMYK_RED_JPEG = base64.b64decode(
    "/9j/7gAOQWRvYmUAZAAAAAAA/9sAQwACAQEBAQECAQEBAgICAgIEAwICAgIFBAQDBAYFBgYGBQYGBgcJCAYHCQcGBggLCAkKCgoKCgYICwwL"
    "CgwJCgoK/8AAFAgACAAIBEMRAE0RAFkRAEsRAP/EAB8AAAEFAQEBAQEBAAAAAAAAAAABAgMEBQYHCAkKC//EALUQAAIBAwMCBAMFBQQEAAAB"
    "fQECAwAEEQUSITFBBhNRYQcicRQygZGhCCNCscEVUtHwJDNicoIJChYXGBkaJSYnKCkqNDU2Nzg5OkNERUZHSElKU1RVVldYWVpjZGVmZ2hp"
    "anN0dXZ3eHl6g4SFhoeIiYqSk5SVlpeYmZqio6Slpqeoqaqys7S1tre4ubrCw8TFxsfIycrS09TV1tfY2drh4uPk5ebn6Onq8fLz9PX29/j5"
    "+v/aAA4EQwBNAFkASwAAPwD9/K/n/r+f+v38r//Z"
)


class _Captured(Exception):
    pass


def network_input(model, monkeypatch, images, cameras) -> np.ndarray:
    """The (3, 224, 224, 3) array the model would compute on, caught at Reconstructor.run."""
    seen = {}

    def capture(images, cameras, trace=None):
        seen["images"], seen["cameras"] = np.asarray(images), np.asarray(cameras)
        raise _Captured

    monkeypatch.setattr(model, "run", capture)
    with pytest.raises(_Captured):
        model(images, cameras)
    assert seen["images"].shape == (1, 3, 224, 224, 3) and seen["images"].dtype == np.float32
    return seen["images"][0]


def test_odd_image_files_are_converted(model, monkeypatch, demo_files, tmp_path):
    """16-bit, grayscale, gray+alpha, paletted (with transparency) and CMYK files reach the network as BGR in [0, 1]."""
    _, cameras = demo_files
    bgr16 = np.empty((224, 224, 3), np.uint16)
    bgr16[...] = (1000, 30000, 65535)
    cv2.imwrite(str(tmp_path / "deep.png"), bgr16)
    cv2.imwrite(str(tmp_path / "gray.png"), np.full((50, 70), 100, np.uint8))
    gray_alpha = np.zeros((224, 224, 2), np.uint8)
    gray_alpha[..., 0], gray_alpha[:, 112:, 1] = 40, 255  # left half transparent -> white
    (tmp_path / "gray_alpha.png").write_bytes(raw_png(gray_alpha, 4))
    indices = np.zeros((224, 224), np.uint8)
    indices[:, 112:] = 1
    indices[200:, :] = 2
    (tmp_path / "palette.png").write_bytes(
        paletted_png(indices, [(255, 0, 0), (0, 128, 255), (9, 9, 9)], transparent=[255, 255, 0])
    )
    (tmp_path / "cmyk.jpg").write_bytes(CMYK_RED_JPEG)

    got = network_input(
        model, monkeypatch, [str(tmp_path / n) for n in ("deep.png", "gray.png", "palette.png")], cameras
    )
    np.testing.assert_allclose(
        got[0], np.broadcast_to(np.array([1000, 30000, 65535]) / 65535, (224, 224, 3)), rtol=0, atol=1e-7
    )
    np.testing.assert_allclose(got[1], 100 / 255, rtol=0, atol=1e-7)
    np.testing.assert_allclose(got[2][:200, :112], np.broadcast_to([0, 0, 1.0], (200, 112, 3)), atol=1e-7)  # red
    np.testing.assert_allclose(got[2][:200, 112:], np.broadcast_to([1.0, 128 / 255, 0], (200, 112, 3)), atol=1e-7)
    np.testing.assert_allclose(got[2][200:], 1.0, atol=1e-7)  # palette entry 2 is transparent -> white

    got = network_input(
        model,
        monkeypatch,
        [str(tmp_path / "cmyk.jpg"), str(tmp_path / "gray_alpha.png"), str(tmp_path / "gray.png")],
        cameras,
    )
    np.testing.assert_allclose(got[0], np.broadcast_to([0, 0, 1.0], (224, 224, 3)), atol=3 / 255)  # CMYK red -> BGR
    np.testing.assert_allclose(got[1][:, :112], 1.0, atol=1e-7)
    np.testing.assert_allclose(got[1][:, 112:], 40 / 255, atol=1e-7)


def test_odd_image_arrays_are_converted(model, monkeypatch, demo_files):
    """uint8, uint16, gray (H, W) and BGRA arrays, of any size, are resized and scaled like files."""
    _, cameras = demo_files
    bgra = np.zeros((30, 30, 4), np.uint8)
    bgra[..., :3] = (10, 20, 30)  # alpha 0 everywhere -> white
    got = network_input(
        model, monkeypatch, [np.full((224, 224, 3), 51, np.uint8), np.full((10, 20), 13107, np.uint16), bgra], cameras
    )
    np.testing.assert_allclose(got[0], 0.2, atol=1e-7)
    np.testing.assert_allclose(got[1], 0.2, atol=1e-7)
    np.testing.assert_allclose(got[2], 1.0, atol=1e-7)


# ----------------------------------------------------------------------------------- cameras


CAMERA_FILE_CASES = {
    # name: (file text or None for special, error class, message parts)
    "two_rows": ("250 29 0 0.65 25\n8 26 0 0.71 25\n", InputError, ["holds 2 camera rows", "3 views are needed"]),
    "four_values": (
        "250 29 0 0.65 25\n8 26 0 0.71\n59 28 0 0.8 25\n",
        FileFormatError,
        ["line 2: 4 values", "expected 5"],
    ),
    "six_values": (
        "250 29 0 0.65 25 1\n8 26 0 0.71 25\n59 28 0 0.8 25\n",
        FileFormatError,
        ["line 1: 6 values", "expected 5"],
    ),
    "words": ("250 29 0 0.65 25\n8 26 zero 0.71 25\n59 28 0 0.8 25\n", FileFormatError, ["line 2", "is not 5 numbers"]),
    "nan": (
        "250 29 0 0.65 25\n8 nan 0 0.71 25\n59 28 0 0.8 25\n",
        InputError,
        ["camera row 1", "NaN or infinite", "expected finite numbers"],
    ),
    "inf": ("250 29 0 0.65 25\n8 26 0 0.71 25\n59 28 0 inf 25\n", InputError, ["camera row 2", "expected finite"]),
    "float32_overflow": (
        "1e39 29 0 0.65 25\n8 26 0 0.71 25\n59 28 0 0.8 25\n",
        InputError,
        ["camera row 0", "float32 range", "expected finite"],
    ),
    "zero_distance": (
        "250 29 0 0 25\n8 26 0 0.71 25\n59 28 0 0.8 25\n",
        InputError,
        ["camera row 0 has distance 0", "expected a distance > 0"],
    ),
    "negative_distance": (
        "250 29 0 0.65 25\n8 26 0 -0.5 25\n59 28 0 0.8 25\n",
        InputError,
        ["camera row 1 has distance -0.5", "expected a distance > 0"],
    ),
    "empty": ("# only a comment\n\n", FileFormatError, ["holds no camera rows", "expected lines of 5 numbers"]),
    "binary": (None, FileFormatError, ["is not UTF-8 text", "expected lines of 5 numbers"]),
    "missing": (None, MissingFileError, ["does not exist", "expected a text file of camera rows"]),
    "directory": (None, InputError, ["is a directory", "expected a cameras.txt"]),
}


@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize("case", sorted(CAMERA_FILE_CASES))
def test_bad_camera_file(case, entry, demo_files, tmp_path, capsys, model):
    text, want_cls, parts = CAMERA_FILE_CASES[case]
    path = tmp_path / f"cams_{case}.txt"
    if text is not None:
        path.write_text(text)
    elif case == "binary":
        path.write_bytes(b"\xff\xfe\x00garbage\x80\x81")
    elif case == "directory":
        path.mkdir()
    cls, message = run_entry(entry, demo_files[0], path, capsys, model, tmp_path)
    if cls is not None:
        assert cls is want_cls
    check_message(message, f"cams_{case}.txt", *parts)


CAMERA_ARRAY_CASES = {
    "shape_3x4": (np.ones((3, 4)), ["cameras array has shape (3, 4)", "expected (3, 5)"]),
    "shape_flat": (np.ones(15), ["cameras array has shape (15,)", "expected (3, 5)"]),
    "two_rows": (np.ones((2, 5)), ["holds 2 camera rows", "3 views are needed"]),
    "nan": (
        np.array([[250, 29, 0, 0.65, 25], [8, 26, np.nan, 0.71, 25], [59, 28, 0, 0.8, 25]]),
        ["camera row 1", "NaN or infinite", "expected finite"],
    ),
    "overflow": (np.full((3, 5), 1e300), ["camera row 0", "float32 range", "expected finite"]),
    "zero_distance": (
        np.array([[250, 29, 0, 0.65, 25], [8, 26, 0, 0.71, 25], [59, 28, 0, 0.0, 25]]),
        ["camera row 2 has distance 0", "expected a distance > 0"],
    ),
    "complex": (np.ones((3, 5), complex), ["dtype complex128", "expected real numbers"]),
    "strings": ([["a"] * 5] * 3, ["dtype <U1", "expected real numbers"]),
    "ragged": ([[1, 2, 3, 4, 5], [1, 2]], ["could not be read as an array", "expected shape (3, 5)"]),
    "bool": (np.ones((3, 5), bool), ["dtype bool", "expected real numbers"]),
}


@pytest.mark.parametrize("entry", ARRAY_ENTRIES)
@pytest.mark.parametrize("case", sorted(CAMERA_ARRAY_CASES))
def test_bad_camera_array(case, entry, demo_files, tmp_path, capsys, model):
    cameras, parts = CAMERA_ARRAY_CASES[case]
    cls, message = run_entry(entry, demo_files[0], cameras, capsys, model, tmp_path)
    assert cls is InputError
    check_message(message, *parts)


VIEW_CASES = {
    "out_of_range": ((0, 1, 5), ["views=[0, 1, 5]", "index 5 is out of range", "has 3 rows (0..2)"]),
    "negative": ((0, 1, -1), ["views=[0, 1, -1]", "index -1 is out of range", "has 3 rows (0..2)"]),
    "two": ((0, 1), ["views=[0, 1]", "2 indices; 3 views are needed"]),
    "float": ((0, 1, 2.0), ["views=[0, 1, 2.0]", "2.0 is not an integer row index"]),
}


@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize("case", sorted(VIEW_CASES))
def test_bad_views(case, entry, demo_files, tmp_path, capsys, model):
    views, parts = VIEW_CASES[case]
    if entry == "cli" and case != "out_of_range":
        pytest.skip("argparse itself takes exactly 3 integers for --views")
    cls, message = run_entry(entry, demo_files[0], demo_files[1], capsys, model, tmp_path, views=views)
    check_message(message, *parts)


# ----------------------------------------------------------------------------------- weights


def _weights_case(case: str, weights: dict) -> dict:
    bad = dict(weights)
    if case == "missing":
        del (
            bad["meshnetmvp2m/cnn/conv2d_3/b:0"],
            bad["meshnet/pixel2mesh/graph_drb_blk2_layer_5/localgconv_12_vars/bias:0"],
        )
    elif case == "wrong_shape":
        bad["meshnetmvp2m/cnn/conv2d_1/W:0"] = np.zeros((3, 3, 3, 8), np.float32)
    elif case == "transposed":
        name = "meshnet/pixel2mesh/graph_drb_blk1_layer_2/localgconv_1_vars/weights_0:0"
        bad[name] = np.ascontiguousarray(bad[name].T)
    elif case == "int_dtype":
        bad["meshnet/cnn/conv2d_2/W:0"] = bad["meshnet/cnn/conv2d_2/W:0"].astype(np.int32)
    elif case == "nan":
        arr = bad["meshnetmvp2m/cnn/conv2d_1/b:0"].copy()
        arr[3] = np.nan
        bad["meshnetmvp2m/cnn/conv2d_1/b:0"] = arr
    elif case == "ragged":
        bad["meshnetmvp2m/cnn/conv2d_1/b:0"] = [[1.0], [1.0, 2.0]]
    elif case == "stage2_only":
        bad = {k: v for k, v in weights.items() if k.startswith("meshnet/")}
    elif case == "stage1_only":
        bad = {k: v for k, v in weights.items() if k.startswith("meshnetmvp2m/")}
    return bad


WEIGHT_CASES = {
    "missing": [
        "2 missing variable(s)",
        "meshnetmvp2m/cnn/conv2d_3/b:0",
        "meshnet/pixel2mesh/graph_drb_blk2_layer_5/localgconv_12_vars/bias:0",
    ],
    "wrong_shape": ["wrong shape", "meshnetmvp2m/cnn/conv2d_1/W:0: expected (3, 3, 3, 16), got (3, 3, 3, 8)"],
    "transposed": ["wrong shape", "localgconv_1_vars/weights_0:0: expected (339, 192), got (192, 339)"],
    "int_dtype": ["non-floating dtype (expected float32)", "meshnet/cnn/conv2d_2/W:0: int32"],
    "nan": ["non-finite", "meshnetmvp2m/cnn/conv2d_1/b:0: 1 value(s)"],
    "ragged": ["meshnetmvp2m/cnn/conv2d_1/b:0: not an array", "expected float32"],
    "stage2_only": ["variables are missing: pass the meshnetmvp2m checkpoint too"],
    "stage1_only": ["variables are missing: pass the meshnet checkpoint too"],
}


@pytest.mark.parametrize("case", sorted(WEIGHT_CASES))
def test_bad_weights_dict(case, weights):
    with pytest.raises(WeightsError) as info:
        xmesh.Reconstructor(_weights_case(case, weights))
    check_message(str(info.value), "weights for stages (1, 2) are invalid", *WEIGHT_CASES[case])


def test_bad_weights_type():
    with pytest.raises(InputError, match="source: expected a path .* got int"):
        xmesh.Reconstructor(42)
    with pytest.raises(InputError, match="empty list of weight sources"):
        xmesh.Reconstructor([])


WEIGHT_FILE_NAMES = {
    "keras_h5": "w.h5",
    "pytorch_zip": "w.pth",
    "png_image": "w.png",
    "random_no_suffix": "w",
    "release_zip": "w.zip",
}


def _weights_file(case: str, tmp_path: Path, weights: dict) -> Path:
    path = tmp_path / WEIGHT_FILE_NAMES.get(case, f"w_{case}.npz")
    if case == "missing":
        return path
    if case == "folder":
        path.mkdir()
    elif case == "garbage":
        path.write_bytes(b"definitely not a zip archive" * 10)
    elif case == "object_array":
        np.savez(path, **{"meshnet/cnn/conv2d_1/W:0": np.array([1, "x"], dtype=object)})
    elif case == "truncated":
        np.savez(path, a=np.zeros(1000, np.float32))
        path.write_bytes(path.read_bytes()[:500])
    elif case == "single_array":
        with open(path, "wb") as handle:
            np.save(handle, np.zeros(3, np.float32))
    elif case == "stage2_one_variable":  # '|' keys as written by tools that dislike '/'
        np.savez(path, **{"meshnet|cnn|conv2d_1|W": weights["meshnet/cnn/conv2d_1/W:0"]})
    elif case == "other_arrays":  # a valid .npz of another model's 240 arrays
        np.savez(path, **{f"encoder/layer{i:03d}/kernel": np.zeros(2, np.float32) for i in range(240)})
    elif case in ("random_bytes", "random_no_suffix"):
        path.write_bytes(np.random.default_rng(7).integers(0, 256, 5000, dtype=np.uint8).tobytes())
    elif case == "keras_h5":
        path.write_bytes(b"\x89HDF\r\n\x1a\n" + bytes(500))
    elif case == "pytorch_zip":
        import zipfile

        with zipfile.ZipFile(path, "w") as archive:
            archive.writestr("archive/data.pkl", pickle.dumps({"w": 1}))
            archive.writestr("archive/version", "3\n")
    elif case == "release_zip":  # the official release's zip, given as it was downloaded
        import zipfile

        with zipfile.ZipFile(path, "w") as archive:
            archive.writestr("checkpoint/meshnet.ckpt-10.index", b"\0" * 48)
            archive.writestr("checkpoint/checkpoint", 'model_checkpoint_path: "meshnet.ckpt-10"\n')
    elif case == "png_image":
        path.write_bytes(cv2.imencode(".png", np.zeros((8, 8, 3), np.uint8))[1].tobytes())
    return path


WEIGHT_FILE_CASES = {
    "missing": (MissingFileError, ["weights file not found", "expected an .npz"]),
    "folder": (InputError, ["is a folder", "expected an .npz file"]),
    "garbage": (WeightsError, ["text, not Pixel2Mesh++ weights", "expected an .npz keyed by the official"]),
    "object_array": (WeightsError, ["object arrays (pickled Python objects", "expected an .npz of plain float32"]),
    "truncated": (WeightsError, ["a truncated or damaged zip archive", "expected an .npz"]),
    "single_array": (WeightsError, ["single array", "expected an .npz"]),
    "stage2_one_variable": (WeightsError, ["pass the meshnetmvp2m checkpoint too", "meshnet/cnn/conv2d_2/W:0"]),
    "other_arrays": (
        WeightsError,
        [
            "an .npz of 240 array(s) (encoder/layer000/kernel, encoder/layer001/kernel, "
            "encoder/layer002/kernel and 237 more), none of them a Pixel2Mesh++ variable",
            "expected the official names, 237 in all (meshnetmvp2m/cnn/conv2d_1/W:0, "
            "meshnetmvp2m/cnn/conv2d_1/b:0, meshnetmvp2m/cnn/conv2d_2/W:0 and 234 more)",
        ],
    ),
    "random_bytes": (WeightsError, ["5000 bytes of unknown content", "not Pixel2Mesh++ weights", "expected an .npz"]),
    "random_no_suffix": (WeightsError, ["5000 bytes of unknown content", "or a TensorFlow checkpoint prefix"]),
    "keras_h5": (WeightsError, ["an HDF5 file", "not Pixel2Mesh++ weights", "expected an .npz"]),
    "pytorch_zip": (WeightsError, ["a PyTorch checkpoint", "not Pixel2Mesh++ weights", "expected an .npz"]),
    "release_zip": (
        WeightsError,
        [
            "a zip archive of 2 file(s) (checkpoint/meshnet.ckpt-10.index, checkpoint/checkpoint",
            "xmesh weights add ZIP",
            "not Pixel2Mesh++ weights",
        ],
    ),
    "png_image": (XmeshError, ["image", "not", "weights"]),  # the command line sees it first: an image after --weights
}
# what the messages of a file of the wrong kind used to give instead of saying what the file is
MISLEADING = ("allow_pickle", "checkpoint index not found", "missing variable")


@pytest.mark.parametrize("entry", ["model", "cli"])
@pytest.mark.parametrize("case", sorted(WEIGHT_FILE_CASES))
def test_bad_weights_file(case, entry, weights, demo_files, tmp_path, capsys):
    path = _weights_file(case, tmp_path, weights)
    want_cls, parts = WEIGHT_FILE_CASES[case]
    if entry == "model":
        with pytest.raises(want_cls) as info:
            xmesh.Reconstructor(str(path))
        message = str(info.value)
    else:
        images, cameras = demo_files
        message = cli_error(
            capsys,
            ["reconstruct", *images, "--cameras", cameras, "--out", str(tmp_path / "m.obj"), "--weights", str(path)],
        )
    check_message(message, *parts)
    if case != "stage2_one_variable":
        check_message(message, path.name)
        assert not any(word in message for word in MISLEADING), message
    assert "\n" not in message.rstrip("\n")


# ----------------------------------------------------------------------------------- checkpoints


def _damage_checkpoint(case: str, prefix: Path) -> None:
    index, shard = Path(f"{prefix}.index"), Path(f"{prefix}.data-00000-of-00001")
    if case == "bad_crc":
        data = bytearray(shard.read_bytes())
        data[100] ^= 0x01  # inside the first tensor
        shard.write_bytes(bytes(data))
    elif case == "truncated_shard":
        shard.write_bytes(shard.read_bytes()[:-1000])
    elif case == "missing_shard":
        shard.unlink()
    elif case == "garbage_index":
        index.write_bytes(np.random.default_rng(1).integers(0, 256, 2200, dtype=np.uint8).tobytes())
    elif case == "truncated_index":
        index.write_bytes(index.read_bytes()[:-10])
    elif case == "index_bad_crc":
        data = bytearray(index.read_bytes())
        data[40] ^= 0x20  # inside the first data block
        index.write_bytes(bytes(data))
    elif case == "missing_index":
        index.unlink()


CHECKPOINT_CASES = {
    "bad_crc": (ChecksumError, ["CRC-32C mismatch for variable", SHARD, "data shard is corrupt"]),
    "truncated_shard": (FileFormatError, [SHARD, "the index needs at least", "truncated"]),
    "missing_shard": (MissingFileError, [SHARD, "checkpoint data shard not found"]),
    "garbage_index": (FileFormatError, [f"{SUBSET}.index", "not a TensorFlow V2 checkpoint .index file"]),
    "truncated_index": (FileFormatError, [f"{SUBSET}.index", "expected 0xdb4775248b80fb57"]),
    "index_bad_crc": (ChecksumError, [f"{SUBSET}.index", "CRC-32C mismatch", "expected an intact"]),
    "missing_index": (MissingFileError, [SUBSET, "not found", "PREFIX.index"]),
}


@pytest.mark.parametrize("entry", ["convert", "model", "cli_reconstruct"])
@pytest.mark.parametrize("case", sorted(CHECKPOINT_CASES))
def test_bad_checkpoint(case, entry, ckpt, tmp_path, capsys, demo_files):
    _damage_checkpoint(case, ckpt)
    want_cls, parts = CHECKPOINT_CASES[case]
    out = tmp_path / "out.npz"
    if entry == "convert":
        message = cli_error(capsys, ["convert", str(ckpt), str(out)])
    elif entry == "cli_reconstruct":
        images, cameras = demo_files
        message = cli_error(
            capsys,
            ["reconstruct", *images, "--cameras", cameras, "--out", str(tmp_path / "m.obj"), "--weights", str(ckpt)],
        )
    else:
        with pytest.raises(want_cls) as info:
            xmesh.Reconstructor(weights=str(ckpt))
        message = str(info.value)
    check_message(message, *parts)
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]  # no output, no temp file


def test_intact_stage2_checkpoint_asks_for_the_other(ckpt, tmp_path, capsys):
    """The subset checkpoint holds only stage-2 variables: the error says to pass the meshnetmvp2m one."""
    with pytest.raises(WeightsError) as info:
        xmesh.Reconstructor(weights=str(ckpt))
    check_message(
        str(info.value),
        "185 missing variable(s)",
        "pass the meshnetmvp2m checkpoint too",
        "meshnet/cnn/conv2d_9/W:0, meshnet/cnn/conv2d_9/b:0, meshnet/cnn/conv2d_10/W:0 and 17 more",
    )
    assert "\n" not in str(info.value)
    # and convert works on it (the positive control for the damaged copies above)
    assert main(["convert", str(ckpt), str(tmp_path / "out.npz")]) == 0
    with np.load(tmp_path / "out.npz") as npz:
        assert len(npz.files) == 52 and npz["meshnet/cnn/conv2d_1/W:0"].shape == (3, 3, 3, 16)


def test_convert_bad_output_paths(ckpt, tmp_path, capsys):
    (tmp_path / "a_folder").mkdir()
    message = cli_error(capsys, ["convert", str(ckpt), str(tmp_path / "a_folder")])
    check_message(message, "a_folder", "is a folder", "expected the path of a file")
    (tmp_path / "a_file").write_text("x")
    message = cli_error(capsys, ["convert", str(ckpt), str(tmp_path / "a_file" / "out.npz")])
    check_message(message, "a_file/out.npz", "cannot be written", "a_file is a file, not a folder")
    message = cli_error(capsys, ["convert", str(tmp_path / "nothing_here"), str(tmp_path / "o.npz")])
    check_message(message, "nothing_here.index", "checkpoint index not found")


# ----------------------------------------------------------------------------------- templates


def _template_case(case: str, data: dict):
    bad = dict(data)
    if case == "missing_keys":
        del bad["pool_idx"], bad["sample_coord"]
    elif case == "not_a_dict":
        return [data["coord"]]
    elif case == "pool_out_of_range":
        pool = np.array(data["pool_idx"][0])
        pool[5, 1] = 156  # level 0 has vertices 0..155
        bad["pool_idx"] = [pool, data["pool_idx"][1]]
    elif case == "pool_wrong_shape":
        bad["pool_idx"] = [np.array(data["pool_idx"][0])[:, :1], data["pool_idx"][1]]
    elif case == "support_wrong_shape":
        coords, values, _ = data["stage2"][1]
        bad["stage2"] = [data["stage2"][0], (coords, values, np.array([619, 619]))]
    elif case == "support_coords_out_of_range":
        coords, values, shape = data["stage1"][1]
        coords = np.array(coords)
        coords[0, 0] = 500
        bad["stage1"] = [data["stage1"][0], (coords, values, shape)]
    elif case == "support_value_count":
        coords, values, shape = data["stage3"][0]
        bad["stage3"] = [(coords, np.asarray(values)[:-1], shape), data["stage3"][1]]
    elif case == "faces_out_of_range":
        faces = np.array(data["faces_triangle"][2])
        faces[0, 0] = 2466
        bad["faces_triangle"] = [data["faces_triangle"][0], data["faces_triangle"][1], faces]
    elif case == "cheb_wrong_shape":
        bad["sample_cheb_dense"] = [np.eye(43, dtype=np.float32), np.zeros((42, 43), np.float32)]
    elif case == "coord_nan":
        coord = np.array(data["coord"])
        coord[7, 2] = np.nan
        bad["coord"] = coord
    elif case == "lape_rows":
        bad["lape_idx"] = [data["lape_idx"][0], np.asarray(data["lape_idx"][1])[:-1], data["lape_idx"][2]]
    return bad


TEMPLATE_CASES = {
    "missing_keys": ["lacks the key(s) pool_idx, sample_coord", "expected all of coord"],
    "not_a_dict": ["holds a list", "expected a dict with the keys"],
    "pool_out_of_range": ["template key pool_idx[0]", "holds indices from 0 to 156", "expected values in [0, 156)"],
    "pool_wrong_shape": ["template key pool_idx[0]", "has shape (462, 1)", "expected an integer (P, 2) array"],
    "support_wrong_shape": ["template key stage2[1] shape", "is (619, 619)", "expected (618, 618)"],
    "support_coords_out_of_range": ["stage1[1] coords", "expected values in [0, 156)"],
    "support_value_count": ["stage3[0]", "2466 coords but 2465 values", "expected the same number"],
    "faces_out_of_range": ["faces_triangle[2]", "expected values in [0, 2466)"],
    "cheb_wrong_shape": ["sample_cheb_dense[1]", "has shape (42, 43)", "expected a float (43, 43) array"],
    "coord_nan": ["template key coord", "1 non-finite value(s)", "expected finite numbers"],
    "lape_rows": ["lape_idx[1]", "has shape (617, 10)", "expected (618, 10)"],
}


def _template_file(case: str, tmp_path: Path, template_dict: dict) -> Path:
    path = tmp_path / f"tpl_{case}.dat"
    if case == "garbage":
        path.write_bytes(b"\x00\x01garbage, not a pickle")
    elif case == "folder":
        path.mkdir()
    elif case != "missing":
        path.write_bytes(pickle.dumps(_template_case(case, template_dict), protocol=2))
    return path


@pytest.mark.parametrize("entry", ["model", "api", "cli"])
@pytest.mark.parametrize("case", sorted(TEMPLATE_CASES) + ["garbage", "folder", "missing"])
def test_bad_template(case, entry, template_dict, weights, demo_files, tmp_path, capsys):
    path = _template_file(case, tmp_path, template_dict)
    parts = (
        TEMPLATE_CASES.get(case)
        or {
            "garbage": ["not a readable data pickle", "expected a Python pickle of NumPy arrays"],
            "folder": ["is a folder", "expected a mesh template (.dat) file"],
            "missing": ["no such mesh template (.dat) file"],
        }[case]
    )
    images, cameras = demo_files
    if entry == "cli":  # the template is checked before the weights are even looked for
        message = cli_error(
            capsys,
            [
                "reconstruct",
                *images,
                "--cameras",
                cameras,
                "--out",
                str(tmp_path / "m.obj"),
                "--weights",
                NO_WEIGHTS,
                "--template",
                str(path),
            ],
        )
    else:
        with pytest.raises(XmeshError) as info:
            if entry == "model":
                xmesh.Reconstructor(weights, template=str(path))
            else:
                xmesh.reconstruct(images, cameras, weights=NO_WEIGHTS, template=path)
        assert isinstance(info.value, (FileFormatError, MissingFileError))
        message = str(info.value)
    check_message(message, path.name, *parts)


def test_valid_template_file_is_accepted(template_dict, weights, tmp_path):
    """Positive control: the golden template re-pickled builds a model."""
    path = tmp_path / "good.dat"
    path.write_bytes(pickle.dumps(template_dict, protocol=2))
    model = xmesh.Reconstructor(weights, template=path)
    assert model.template.num_vertices == (156, 618, 2466) and model.faces.shape == (4928, 3)


# ----------------------------------------------------------------------------------- render / demo CLI


@pytest.mark.parametrize(
    "case",
    [
        "missing_mesh",
        "faces_only",
        "png_as_mesh",
        "bad_cameras",
        "size_0",
        "size_huge",
        "out_jpg",
        "out_folder",
        "points_unsafe",
        "points_missing",
        "mesh_folder",
    ],
)
def test_render_bad_input(case, demo_dir, tmp_path, capsys):
    mesh, cameras, out = str(demo_dir / "predict.obj"), str(demo_dir / "cameras.txt"), str(tmp_path / "r.png")
    extra = []
    if case == "missing_mesh":
        mesh, parts = str(tmp_path / "nope.obj"), ["nope.obj", "does not exist"]
    elif case == "faces_only":
        mesh, parts = str(demo_dir / "face3.obj"), ["face3.obj", "the file defines 0 vertices"]
    elif case == "png_as_mesh":
        mesh, parts = str(demo_dir / "plane1.png"), ["plane1.png", "expected .obj or .ply"]
    elif case == "bad_cameras":
        (tmp_path / "c.txt").write_text("1 2 3\n")
        cameras, parts = str(tmp_path / "c.txt"), ["c.txt", "line 1: 3 values", "expected 5"]
    elif case == "size_0":
        extra, parts = ["--size", "0"], ["--size 0", "expected a whole number of pixels per view from 1 to 4096"]
    elif case == "size_huge":
        extra, parts = ["--size", "100000"], ["--size 100000", "from 1 to 4096"]
    elif case == "out_jpg":
        out, parts = str(tmp_path / "r.jpg"), ["r.jpg", "expected a .png file name"]
    elif case == "out_folder":
        (tmp_path / "pic.png").mkdir()
        out, parts = str(tmp_path / "pic.png"), ["pic.png", "is a folder", "expected the path of a .png file"]
    elif case == "points_unsafe":
        (tmp_path / "gt.dat").write_bytes(b"cposix\nsystem\n(S'touch " + str(tmp_path / "pwned").encode() + b"'\ntR.")
        extra, parts = ["--points", str(tmp_path / "gt.dat")], ["gt.dat", "posix.system", "nothing in it was run"]
    elif case == "points_missing":
        extra, parts = ["--points", str(tmp_path / "gt.xyz")], ["gt.xyz", "does not exist"]
    else:
        (tmp_path / "m.ply").mkdir()
        mesh, parts = str(tmp_path / "m.ply"), ["m.ply", "is a directory; expected a file"]
    message = cli_error(capsys, ["render", mesh, "--cameras", cameras, "--out", out, *extra])
    check_message(message, *parts)
    assert not (tmp_path / "pwned").exists()
    assert not Path(out).is_file()


@pytest.mark.parametrize("case", ["out_is_file", "weights_missing", "weights_garbage", "weights_stage2_only"])
def test_demo_bad_input(case, weights, tmp_path, capsys):
    out = tmp_path / "demo"
    argv = ["demo", "--out", str(out)]
    if case == "out_is_file":
        out.write_text("a file, not a folder")
        parts = ["--out", "demo: is a file", "expected a folder"]
    else:
        path = _weights_file(
            {"weights_missing": "missing", "weights_garbage": "garbage", "weights_stage2_only": "stage2_one_variable"}[
                case
            ],
            tmp_path,
            weights,
        )
        argv += ["--weights", str(path)]
        parts = [
            {
                "weights_missing": "weights file not found",
                "weights_garbage": "text, not Pixel2Mesh++ weights",
                "weights_stage2_only": "pass the meshnetmvp2m checkpoint too",
            }[case]
        ]
    message = cli_error(capsys, argv)
    check_message(message, *parts)
    if case != "out_is_file":
        assert not out.exists()  # refused before anything was rendered


def test_demo_unavailable_backend(tmp_path, capsys):
    try:
        import cupy  # noqa: F401

        pytest.skip("CuPy is installed here")
    except ImportError:
        pass
    message = cli_error(capsys, ["demo", "--out", str(tmp_path / "d"), "--backend", "cupy"])
    check_message(message, "backend='cupy' needs CuPy", "or use backend='numpy'")
    assert not (tmp_path / "d").exists()


def test_reconstruct_bad_output_option(demo_files, tmp_path, capsys):
    images, cameras = demo_files
    base = ["reconstruct", *images, "--cameras", cameras, "--weights", NO_WEIGHTS]
    check_message(
        cli_error(capsys, base + ["--out", str(tmp_path / "m.stl")]),
        "--out",
        "m.stl",
        "'.stl'",
        "use one of .obj, .ply, .xyz",
    )
    (tmp_path / "dir.obj").mkdir()
    check_message(
        cli_error(capsys, base + ["--out", str(tmp_path / "dir.obj")]),
        "dir.obj",
        "is a folder",
        "expected the path of a mesh file",
    )
    check_message(
        cli_error(capsys, base + ["--out", str(tmp_path / "m.obj"), "--coarse-out", "c.off"]),
        "--coarse-out c.off",
        "use one of",
    )
    check_message(
        cli_error(
            capsys,
            base[:1] + images + ["--cameras", cameras, "--out", str(tmp_path / "m.obj"), "--weights", "synthetic:abc"],
        ),
        "synthetic:abc",
        "expected synthetic:N",
    )


def test_images_after_weights_are_named_not_taken_for_weights(demo_files, tmp_path, capsys):
    images, cameras = demo_files
    message = cli_error(
        capsys,
        ["reconstruct", "--weights", "synthetic:1", *images, "--cameras", cameras, "--out", str(tmp_path / "m.obj")],
    )
    check_message(
        message, "--weights took 4 value(s), 3 of them image(s)", ", ".join(images), "give the images before --weights"
    )


def test_misleading_one_liners_now_name_the_real_fault(demo_files, tmp_path, capsys):
    images, cameras = demo_files
    base = ["reconstruct", *images, "--cameras", cameras]
    (tmp_path / "results").mkdir()
    check_message(
        cli_error(capsys, base + ["--out", str(tmp_path / "results"), "--weights", NO_WEIGHTS]),
        "results: is a folder",
        "a folder goes with --list",
    )
    for url in ("127.0.0.1:8000", "localhost:8000/"):
        check_message(
            cli_error(capsys, base + ["--out", str(tmp_path / "m.obj"), "--server", url]),
            f"server URL {url!r}",
            "expected http://HOST:PORT",
            f"e.g. http://{url}",
        )
    mesh = str(tmp_path / "m.stl")
    Path(mesh).write_text("solid x\n")
    message = cli_error(capsys, ["render", mesh, "--cameras", cameras, "--out", str(tmp_path / "r.png")])
    check_message(message, f"mesh file {mesh!r}: extension '.stl'", "expected .obj or .ply")
    assert "read_mesh" not in message


def test_camera_rows_count_from_0_in_every_message_and_lines_from_1(demo_files, tmp_path, capsys):
    images, _ = demo_files
    cameras = tmp_path / "c.txt"
    for text, parts in (
        (
            "# header\n250 29 0 0.65 25\n8 26 0 -1 25\n59 28 0 0.7 25\n",
            ["camera row 1 has distance -1", "line 3; camera rows count from 0"],
        ),
        ("250 29 0 0.65 25\n\n8 26 0 0.7\n", ["line 3: 4 values", "camera row 1; camera rows count from 0"]),
    ):
        cameras.write_text(text)
        message = cli_error(
            capsys,
            [
                "reconstruct",
                *images,
                "--cameras",
                str(cameras),
                "--out",
                str(tmp_path / "m.obj"),
                "--weights",
                NO_WEIGHTS,
            ],
        )
        check_message(message, *parts)


@pytest.fixture()
def listed(tmp_path):
    """A list of three samples, and empty renderings and ground-truth folders."""
    ids = [f"02691156_{item}_00.dat" for item in ("aaa", "bbb", "ccc")]
    (tmp_path / "list.txt").write_text("".join(f"{i}\n" for i in ids))
    for folder in ("renderings", "gt"):
        (tmp_path / folder).mkdir()
    return ids


@pytest.mark.parametrize("command", ["eval", "reconstruct"])
def test_dataset_commands_name_a_missing_root_and_every_missing_sample_and_leave_no_folder(
    command, listed, tmp_path, capsys
):
    def argv(images, gt=str(tmp_path / "gt")):
        given = [
            "--list",
            str(tmp_path / "list.txt"),
            "--images",
            images,
            "--weights",
            "synthetic:1",
            "--out",
            str(tmp_path / "out"),
            "--no-progress",
        ]
        return [command, *given, *(["--gt", gt] if command == "eval" else [])]

    message = cli_error(capsys, argv(str(tmp_path / "nosuch")))
    check_message(message, f"--images {tmp_path / 'nosuch'}: does not exist", "expected the ShapeNetRendering folder")
    if command == "eval":
        check_message(
            cli_error(capsys, argv(str(tmp_path / "renderings"), str(tmp_path / "list.txt"))),
            "--gt",
            "list.txt: is a file",
            "expected the folder of the ground truth",
        )
    message = cli_error(capsys, argv(str(tmp_path / "renderings")))
    check_message(
        message,
        "3 of the 3 sample(s) to run lack files",
        f"sample {listed[0]}: rendering 00.png file",
        f"also {listed[1]}, {listed[2]}",
    )
    assert not (tmp_path / "out").exists()  # refused before the output folder was made


# ----------------------------------------------------------------------------------- mesh arguments


@pytest.mark.parametrize(
    "vertices, faces, parts",
    [
        ([[0, 0, 0], [1, 0]], [], ["vertices", "cannot be read as an array"]),
        (np.zeros((3, 2)), [], ["vertices has shape (3, 2)", "expected (V, 3)"]),
        (np.full((3, 3), 1e39), [], ["vertices row 0", "expected finite coordinates"]),
        (np.zeros((3, 3), complex), [], ["vertices has dtype complex128", "expected real numbers"]),
        (np.zeros((3, 3)), [[0, 1, 2], [0, 1]], ["faces", "cannot be read as an array"]),
        (np.zeros((3, 3)), [[0, 1, 3]], ["face 0 is [0, 1, 3]", "expected 0-based vertex indices in [0, 2]"]),
        (np.zeros((3, 3)), np.zeros((1, 3)), ["faces have dtype float64", "expected integer vertex indices"]),
    ],
)
def test_bad_mesh_arguments(vertices, faces, parts):
    with pytest.raises(InputError) as info:
        Mesh(vertices, faces)
    check_message(str(info.value), "Mesh:", *parts)


def test_mesh_writer_bad_paths(tmp_path):
    mesh = Mesh(np.eye(3), [[0, 1, 2]])
    with pytest.raises(InputError, match="OBJ output .* is a folder; expected the path of a file"):
        mesh.to_obj(tmp_path)
    (tmp_path / "f").write_text("x")
    for write in (mesh.to_obj, mesh.to_xyz, mesh.to_ply):
        with pytest.raises(
            InputError,
            match=r"cannot write the (OBJ|XYZ|PLY) file .*f/m' "
            r"\(a part of its folder path is a file.*expected a writable",
        ):
            write(tmp_path / "f" / "m")
    with pytest.raises(InputError, match="PLY path .* is a directory"):
        read_ply(tmp_path)
    with pytest.raises(InputError, match="OBJ path .* is a directory"):
        read_obj(tmp_path)
    with pytest.raises(InputError, match="XYZ path .* is a directory"):
        read_xyz(tmp_path)


# ----------------------------------------------------------------------------------- atomic outputs


@contextlib.contextmanager
def breaking_handle(real_atomic_write, path, mode="w", encoding=None):
    """``atomic_write`` whose handle writes half of the first big chunk, then fails like a full disk."""

    class Half:
        def __init__(self, handle):
            self._handle = handle

        def write(self, data):
            if len(data) > 64:
                self._handle.write(data[: len(data) // 2])
                self._handle.flush()
                raise OSError(28, "No space left on device (simulated)")
            return self._handle.write(data)

        def __getattr__(self, name):
            return getattr(self._handle, name)

    with real_atomic_write(path, mode, encoding) if encoding else real_atomic_write(path, mode) as handle:
        yield Half(handle)


# (coarse, refined) vertices of one sample from a stand-in network, so that writing can be tested
# without seconds of compute
_FAKE = tuple(np.random.default_rng(seed).standard_normal((1, 2466, 3)).astype(np.float32) for seed in (0, 1))


def _fake_run(model, images, cameras, trace=None):
    assert np.asarray(images).shape == (1, 3, 224, 224, 3) and np.asarray(cameras).shape == (1, 3, 5)
    return _FAKE


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


@pytest.mark.parametrize("suffix", [".obj", ".ply", ".xyz"])
@pytest.mark.parametrize("how", ["rows", "replace", "interrupt"])
def test_reconstruct_failed_write_keeps_old_file(how, suffix, demo_files, weights, tmp_path, capsys, monkeypatch):
    import xmesh.commands.reconstruct as command
    import xmesh.mesh as mesh_module

    images, cameras = demo_files
    out = tmp_path / f"mesh{suffix}"
    out.write_text("previous mesh\n")
    monkeypatch.setattr(command, "resolve_weights", lambda values: weights)
    monkeypatch.setattr(xmesh.Reconstructor, "run", _fake_run)
    if how == "rows":
        real = mesh_module._write_rows

        def rows_then_fail(handle, fmt, rows):
            real(handle, fmt, rows[: len(rows) // 2])
            handle.flush()
            raise OSError(28, "No space left on device (simulated)")

        monkeypatch.setattr(mesh_module, "_write_rows", rows_then_fail)
    elif how == "replace":

        def no_replace(src, dst):
            raise PermissionError(13, "Permission denied (simulated)", str(dst))

        monkeypatch.setattr(os, "replace", no_replace)
    else:
        import xmesh.io.atomic as atomic_module

        real_write = atomic_module.atomic_write

        @contextlib.contextmanager
        def interrupted(path, mode="w", encoding=None):
            with real_write(path, mode) as handle:
                handle.write("v 1 2 3\n" if mode == "w" else b"ply\n")
                raise KeyboardInterrupt

            yield  # pragma: no cover

        monkeypatch.setattr(atomic_module, "atomic_write", interrupted)  # what Mesh's writers open
    argv = ["reconstruct", *images, "--cameras", cameras, "--out", str(out), "--weights", "unused.npz"]
    if how == "interrupt":
        assert main(argv) == 130
        assert "interrupted" in capsys.readouterr().err
    else:
        message = cli_error(capsys, argv)
        check_message(
            message,
            out.name,
            "Permission denied" if how == "replace" else "No space left",
            "previous file, if any, is unchanged",
        )
    assert out.read_text() == "previous mesh\n"
    assert _leftovers(tmp_path) == [out.name]


def test_reconstruct_cli_writes_after_validation(demo_files, weights, tmp_path, capsys, monkeypatch):
    """The reordered command (inputs checked before the model is built) still hands the validated
    images and cameras to the network and writes what it returns (a stand-in network: a real run
    costs seconds; the golden tests cover the numbers)."""
    import xmesh.commands.reconstruct as command

    monkeypatch.setattr(command, "resolve_weights", lambda values: weights)
    seen = []

    def recording_run(self, images, cameras, trace=None):
        seen.append((np.array(images), np.array(cameras)))
        return _fake_run(self, images, cameras)

    monkeypatch.setattr(xmesh.Reconstructor, "run", recording_run)
    images, cameras = demo_files
    out, coarse = tmp_path / "m.obj", tmp_path / "c.ply"
    assert (
        main(
            [
                "reconstruct",
                *images,
                "--cameras",
                cameras,
                "--out",
                str(out),
                "--coarse-out",
                str(coarse),
                "--weights",
                "unused.npz",
                "--views",
                "2",
                "0",
                "1",
            ]
        )
        == 0
    )
    assert "wrote" in capsys.readouterr().err
    ((host_images, host_cameras),) = seen
    np.testing.assert_array_equal(host_images[0], load_images(images))
    np.testing.assert_array_equal(host_cameras[0], np.loadtxt(cameras, dtype=np.float64)[[2, 0, 1]].astype(np.float32))
    mesh, coarse_mesh = read_obj(out), read_ply(coarse)
    assert mesh.vertices.shape == (2466, 3) and mesh.faces.shape == (4928, 3)
    fake_coarse, fake_refined = _FAKE[0][0], _FAKE[1][0]
    np.testing.assert_array_equal(mesh.vertices, fake_refined)
    np.testing.assert_array_equal(coarse_mesh.vertices, fake_coarse)
    np.testing.assert_array_equal(coarse_mesh.faces, mesh.faces)
    assert _leftovers(tmp_path) == ["c.ply", "m.obj"]


@pytest.mark.parametrize("how", ["write", "interrupt"])
def test_convert_failed_write_keeps_old_file(how, ckpt, tmp_path, capsys, monkeypatch):
    import xmesh.io.atomic as atomic_module  # convert writes through atomic_output -> atomic_write

    out = tmp_path / "weights.npz"
    out.write_bytes(b"previous npz")
    real = atomic_module.atomic_write
    if how == "write":
        monkeypatch.setattr(atomic_module, "atomic_write", lambda path, mode: breaking_handle(real, path, mode))
        message = cli_error(capsys, ["convert", str(ckpt), str(out)])
        check_message(message, "weights.npz", "writing the .npz failed", "No space left", "previous file")
    else:
        real_savez = np.savez

        def savez_then_interrupt(handle, **arrays):
            real_savez(handle, **dict(list(arrays.items())[:3]))
            raise KeyboardInterrupt

        monkeypatch.setattr(np, "savez", savez_then_interrupt)
        assert main(["convert", str(ckpt), str(out)]) == 130
    assert out.read_bytes() == b"previous npz"
    assert _leftovers(tmp_path) == ["ckpt", "weights.npz"]


@pytest.mark.parametrize("how", ["write", "fsync"])
def test_render_failed_write_keeps_old_file(how, demo_dir, tmp_path, capsys, monkeypatch):
    import xmesh.render.draw as draw

    out = tmp_path / "picture.png"
    out.write_bytes(b"previous png")
    if how == "write":
        real = draw.atomic_write
        monkeypatch.setattr(draw, "atomic_write", lambda path, mode: breaking_handle(real, path, mode))
    else:

        def no_fsync(fd):
            raise OSError(5, "Input/output error (simulated)")

        monkeypatch.setattr(os, "fsync", no_fsync)
    message = cli_error(
        capsys,
        [
            "render",
            str(demo_dir / "predict.obj"),
            "--cameras",
            str(demo_dir / "cameras.txt"),
            "--out",
            str(out),
            "--size",
            "32",
        ],
    )
    check_message(message, "picture.png", "writing failed", "previous file, if any, is unchanged")
    assert out.read_bytes() == b"previous png"
    assert _leftovers(tmp_path) == ["picture.png"]
