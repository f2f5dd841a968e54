"""Image loading: the original's loader reproduced bit for bit, real-world file kinds, and errors."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import cv2
import numpy as np
import pytest

from xmesh.errors import FileFormatError, InputError, MissingFileError
from xmesh.io.images import NUM_VIEWS, load_image, load_images, prepare_image

# --------------------------------------------------------------------------- small file writers


def _png_chunk(kind: bytes, payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload) & 0xFFFFFFFF)


def _png(rows: np.ndarray, color_type: int, extra: bytes = b"") -> bytes:
    """An 8-bit PNG of the given colour type from (H, W*channels) uint8 rows (filter 0 per row)."""
    height = rows.shape[0]
    width = rows.shape[1] // {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}[color_type]
    header = struct.pack(">IIBBBBB", width, height, 8, color_type, 0, 0, 0)
    raw = b"".join(b"\x00" + row.tobytes() for row in rows.astype(np.uint8))
    return (
        b"\x89PNG\r\n\x1a\n"
        + _png_chunk(b"IHDR", header)
        + extra
        + _png_chunk(b"IDAT", zlib.compress(raw))
        + _png_chunk(b"IEND", b"")
    )


def _jpeg_segment(marker: int, payload: bytes) -> bytes:
    return bytes([0xFF, marker]) + struct.pack(">H", len(payload) + 2) + payload


def _cmyk_jpeg(stored: tuple[int, int, int, int]) -> bytes:
    """An 8x8 one-colour baseline CMYK JPEG (Adobe marker, no colour transform).

    Quantiser 8 everywhere makes the quantised DC coefficient equal to value - 128; AC is all zero
    (a 1-bit EOB code), DC categories use 4-bit codes.
    """
    out = b"\xff\xd8"
    out += _jpeg_segment(0xEE, b"Adobe" + struct.pack(">HHHB", 100, 0, 0, 0))
    out += _jpeg_segment(0xDB, b"\x00" + bytes([8] * 64))
    out += _jpeg_segment(0xC0, struct.pack(">BHHB", 8, 8, 8, 4) + b"".join(bytes([c + 1, 0x11, 0]) for c in range(4)))
    out += _jpeg_segment(0xC4, b"\x00" + bytes([0, 0, 0, 9] + [0] * 12) + bytes(range(9)))
    out += _jpeg_segment(0xC4, b"\x10" + bytes([1] + [0] * 15) + b"\x00")
    out += _jpeg_segment(0xDA, bytes([4]) + b"".join(bytes([c + 1, 0]) for c in range(4)) + bytes([0, 63, 0]))
    bits = ""
    for value in stored:
        q = int(value) - 128
        cat = abs(q).bit_length()
        bits += format(cat, "04b") + (format(q if q >= 0 else q + (1 << cat) - 1, f"0{cat}b") if cat else "") + "0"
    bits += "1" * (-len(bits) % 8)
    scan = bytes(int(bits[i : i + 8], 2) for i in range(0, len(bits), 8)).replace(b"\xff", b"\xff\x00")
    return out + scan + b"\xff\xd9"


def _write(path: Path, image: np.ndarray, ext: str = ".png") -> Path:
    ok, encoded = cv2.imencode(ext, image)
    assert ok
    encoded.tofile(str(path))
    return path


def _constant(value, channels=None, size=(5, 7), dtype=np.uint8) -> np.ndarray:
    shape = size if channels is None else (*size, channels)
    image = np.empty(shape, dtype=dtype)
    image[...] = value
    return image


# --------------------------------------------------------------------------- the original loader


def test_demo_images_equal_golden(demo_dir, golden_dir):
    golden = np.load(golden_dir / "demo_seed1.npz")["images"]
    images = load_images([demo_dir / f"plane{i}.png" for i in (1, 2, 3)])
    assert images.shape == (3, 224, 224, 3) and images.dtype == np.float32
    assert float(np.abs(images - golden).max()) <= 1e-7
    assert np.count_nonzero(images != golden) == 0  # bit-identical with this OpenCV
    # one file at a time, and as str paths
    one = load_image(str(demo_dir / "plane2.png"))
    assert np.array_equal(one, golden[1])


def test_demo_png_has_transparent_background(demo_dir):
    raw = cv2.imread(str(demo_dir / "plane1.png"), cv2.IMREAD_UNCHANGED)
    assert raw.shape[2] == 4 and (raw[:, :, 3] == 0).any()  # the alpha rule is exercised by the test above


def test_transparent_pixels_become_white_opaque_kept(tmp_path):
    image = _constant((10, 20, 30, 0), 4)
    image[:, 4:] = (10, 20, 30, 255)  # right part opaque
    out = load_image(_write(tmp_path / "rgba.png", image))
    assert out.shape == (224, 224, 3) and out.dtype == np.float32
    assert np.all(out[:, :96] == 1.0)  # transparent -> 255 in every channel
    expected = (np.array([10, 20, 30]) / 255.0).astype(np.float32)
    assert np.all(out[:, 192:] == expected)  # BGR order, /255
    assert np.all((out >= 0) & (out <= 1))


def test_8bit_bgr_keeps_channel_order_and_resizes(tmp_path):
    out = load_image(_write(tmp_path / "bgr.png", _constant((0, 128, 255), 3, size=(300, 500))))
    assert np.all(out == np.array([0, 128 / 255, 1.0], dtype=np.float32))


def test_grayscale_becomes_three_equal_channels(tmp_path):
    gray = np.arange(64, dtype=np.uint8).reshape(8, 8) * 3
    out = load_image(_write(tmp_path / "gray.png", gray))
    assert out.shape == (224, 224, 3)
    assert np.array_equal(out[:, :, 0], out[:, :, 1]) and np.array_equal(out[:, :, 0], out[:, :, 2])
    constant = load_image(_write(tmp_path / "gray77.jpg", _constant(77), ext=".png"))
    assert np.all(constant == np.float32(77 / 255))


def test_16bit_is_divided_by_65535(tmp_path):
    value = 13107  # 0.2 * 65535
    out = load_image(_write(tmp_path / "g16.png", _constant(value, dtype=np.uint16)))
    assert np.all(out == np.float32(value / 65535))
    bgr = load_image(_write(tmp_path / "c16.png", _constant((0, 65535, 32768), 3, dtype=np.uint16)))
    assert np.all(bgr == np.array([0.0, 1.0, 32768 / 65535], dtype=np.float32))
    rgba = _constant((100, 200, 300, 0), 4, dtype=np.uint16)
    assert np.all(load_image(_write(tmp_path / "a16.png", rgba)) == 1.0)


def test_paletted_png(tmp_path):
    palette = _png_chunk(b"PLTE", bytes([255, 0, 0, 0, 255, 0]))  # RGB entries: red, green
    rows = np.zeros((4, 4), np.uint8)
    rows[:, 2:] = 1
    path = tmp_path / "pal.png"
    path.write_bytes(_png(rows, 3, extra=palette))
    out = load_image(path)
    assert np.all(out[:, :80] == np.array([0, 0, 1], np.float32))  # red in BGR
    assert np.all(out[:, 144:] == np.array([0, 1, 0], np.float32))
    # a tRNS chunk makes entry 0 transparent -> white
    path.write_bytes(_png(rows, 3, extra=palette + _png_chunk(b"tRNS", bytes([0, 255]))))
    out = load_image(path)
    assert np.all(out[:, :80] == 1.0)
    assert np.all(out[:, 144:] == np.array([0, 1, 0], np.float32))


def test_gray_alpha_png(tmp_path):
    rows = np.zeros((4, 8), np.uint8)  # 4x4 pixels of (gray, alpha)
    rows[:, 0::2] = 51
    rows[:, 1::2] = 255
    rows[:, 4:] = (51, 0, 51, 0)  # right half transparent
    path = tmp_path / "ga.png"
    path.write_bytes(_png(rows, 4))
    out = load_image(path)
    assert np.all(out[:, :80] == np.float32(51 / 255))
    assert np.all(out[:, 144:] == 1.0)


def test_two_channel_array_is_gray_alpha():
    image = _constant((51, 255), 2)
    image[:, :3] = (51, 0)
    out = prepare_image(image)
    assert np.all(out[:, -10:] == np.float32(51 / 255)) and np.all(out[:, :10] == 1.0)


def test_cmyk_jpeg_decodes_to_bgr(tmp_path):
    white = tmp_path / "white_cmyk.jpg"
    white.write_bytes(_cmyk_jpeg((255, 255, 255, 255)))  # Adobe (inverted) CMYK: no ink
    assert np.all(load_image(white) == 1.0)
    black = tmp_path / "black_cmyk.jpg"
    black.write_bytes(_cmyk_jpeg((255, 255, 255, 0)))  # full black ink
    assert np.all(load_image(black) == 0.0)
    cyan = tmp_path / "cyan_cmyk.jpg"
    cyan.write_bytes(_cmyk_jpeg((0, 255, 255, 255)))  # full cyan ink: red gone
    out = load_image(cyan)
    assert out.shape == (224, 224, 3)
    assert np.all(out[:, :, :2] > 0.99) and np.all(out[:, :, 2] < 0.01)


def test_jpeg_and_non_ascii_path(tmp_path):
    folder = tmp_path / "données_飛行機"
    folder.mkdir()
    path = _write(folder / "flugzeug_ü.jpg", _constant((40, 80, 160), 3, size=(32, 32)), ext=".jpg")
    out = load_image(path)
    assert np.allclose(out[0, 0], np.array([40, 80, 160]) / 255, atol=3 / 255)


def test_float_tiff_taken_as_unit_range(tmp_path):
    image = _constant((0.25, 0.5, 0.75), 3, dtype=np.float32)
    out = load_image(_write(tmp_path / "f.tiff", image, ext=".tiff"))
    assert np.all(out == np.array([0.25, 0.5, 0.75], np.float32))
    _write(tmp_path / "big.tiff", image * 4, ext=".tiff")
    with pytest.raises(InputError, match=r"big\.tiff.*\[0, 1\]"):
        load_image(tmp_path / "big.tiff")


# --------------------------------------------------------------------------- file errors


def test_missing_file(tmp_path):
    path = tmp_path / "nope.png"
    with pytest.raises(MissingFileError, match="nope.png.*does not exist"):
        load_image(path)
    with pytest.raises(FileNotFoundError):  # the built-in family still catches it
        load_images([path, path, path])


def test_empty_garbage_truncated_and_directory(tmp_path):
    empty = tmp_path / "empty.png"
    empty.write_bytes(b"")
    with pytest.raises(FileFormatError, match=r"empty\.png.*empty"):
        load_image(empty)
    garbage = tmp_path / "garbage.jpg"
    garbage.write_bytes(b"this is not an image at all" * 10)
    with pytest.raises(FileFormatError, match=r"garbage\.jpg.*could not be decoded"):
        load_image(garbage)
    ok, encoded = cv2.imencode(".png", (np.random.default_rng(0).random((64, 64, 3)) * 255).astype(np.uint8))
    truncated = tmp_path / "truncated.png"
    truncated.write_bytes(encoded.tobytes()[: encoded.size // 2])
    with pytest.raises(FileFormatError, match=r"truncated\.png"):
        load_image(truncated)
    ok, encoded = cv2.imencode(".jpg", (np.random.default_rng(1).random((64, 64, 3)) * 255).astype(np.uint8))
    cut_jpeg = tmp_path / "cut.jpg"
    cut_jpeg.write_bytes(encoded.tobytes()[:-200])
    with pytest.raises(FileFormatError, match=r"cut\.jpg"):
        load_image(cut_jpeg)
    with pytest.raises(InputError, match="is a directory"):
        load_image(tmp_path)
    with pytest.raises(InputError, match="path must be"):
        load_image(12)


# --------------------------------------------------------------------------- load_images inputs


def test_number_of_views():
    assert NUM_VIEWS == 3
    with pytest.raises(InputError, match="got 2 images; 3 views are needed"):
        load_images(["a.png", "b.png"])
    with pytest.raises(InputError, match="3 views are needed"):
        load_images("a.png")
    with pytest.raises(InputError, match="holds 2 views.*3 views are needed"):
        load_images(np.zeros((2, 224, 224, 3), np.float32))


def test_network_array_validation():
    good = np.random.default_rng(0).random((3, 224, 224, 3)).astype(np.float32)
    out = load_images(good)
    assert out.dtype == np.float32 and np.array_equal(out, good)
    assert np.array_equal(load_images(good.astype(np.float64)), good)
    as_uint8 = (good * 255).astype(np.uint8)
    assert np.array_equal(load_images(as_uint8), (as_uint8 / 255.0).astype(np.float32))
    with pytest.raises(InputError, match=r"shape \(3, 100, 100, 3\); expected \(3, 224, 224, 3\)"):
        load_images(np.zeros((3, 100, 100, 3), np.float32))
    with pytest.raises(InputError, match="expected"):
        load_images(np.zeros((224, 224, 3), np.float32))
    bad = good.copy()
    bad[1, 2, 3, 0] = np.nan
    with pytest.raises(InputError, match="NaN or infinite"):
        load_images(bad)
    with pytest.raises(InputError, match=r"values span \[0, 2\].*\[0, 1\]"):
        load_images(good * 0 + np.float32(2) * (good > 0.5))
    with pytest.raises(InputError, match="dtype bool"):
        load_images(np.zeros((3, 224, 224, 3), bool))
    with pytest.raises(InputError, match="dtype complex"):
        load_images(np.zeros((3, 224, 224, 3), np.complex64))


def test_list_of_arrays_and_mixed(demo_dir, golden_dir):
    golden = np.load(golden_dir / "demo_seed1.npz")["images"]
    raw = [cv2.imread(str(demo_dir / f"plane{i}.png"), cv2.IMREAD_UNCHANGED) for i in (1, 2, 3)]
    assert np.array_equal(load_images(raw), golden)  # BGRA arrays go through the same pipeline
    mixed = load_images([demo_dir / "plane1.png", raw[1], _constant((255, 0, 0), 3, size=(10, 30))])
    assert np.array_equal(mixed[:2], golden[:2])
    assert np.all(mixed[2] == np.array([1, 0, 0], np.float32))
    with pytest.raises(InputError, match="image 2 is a int"):
        load_images([raw[0], raw[1], 5])
    with pytest.raises(InputError, match=r"image 0: image has shape \(4, 4, 5\)"):
        load_images([np.zeros((4, 4, 5), np.uint8), raw[1], raw[2]])
    with pytest.raises(InputError, match=r"image 1: float image values span"):
        load_images([raw[0], np.full((4, 4, 3), 3.0), raw[2]])
    with pytest.raises(InputError, match="dtype int64 is not supported"):
        load_images([raw[0], np.full((4, 4, 3), 3), raw[2]])
    with pytest.raises(InputError, match="not understood"):
        load_images(x for x in raw)


@pytest.mark.parametrize("channels", [1, 2, 3, 4])
def test_the_8bit_path_gives_the_originals_float_input_bit_for_bit(channels):
    """The loaders' 8-bit path (alpha dropped before the resize, the division by 255 left to the device)
    against the original's order in ``prepare_image`` (alpha == 0 set to white on all four channels,
    the four resized, the first three divided): equal bits, for sizes below, at and above 224."""
    from xmesh.io.images import UINT8_TO_UNIT, prepare_image, prepare_image_u8

    rng = np.random.default_rng(channels)
    for height, width in [(137, 137), (224, 224), (300, 211), (1, 5)]:
        shape = (height, width) if channels == 1 else (height, width, channels)
        image = rng.integers(0, 256, shape, dtype=np.uint8)
        if channels in (2, 4):
            image[..., -1][rng.random((height, width)) < 0.3] = 0
        fast = prepare_image_u8(image)
        assert fast.dtype == np.uint8 and fast.shape == (224, 224, 3) and fast.flags.c_contiguous
        np.testing.assert_array_equal(UINT8_TO_UNIT[fast], prepare_image(image))
