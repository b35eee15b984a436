"""The numpy-only image reader (PNG filters, palettes, PNM), Pillow-style resize and the presets."""

from __future__ import annotations

import struct
import zlib

import numpy as np
import pytest

from ivit_onnx import images


def _paeth(a, b, c):
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    return a if pa <= pb and pa <= pc else b if pb <= pc else c


def _filter_row(ftype: int, row: np.ndarray, prior: np.ndarray, bpp: int) -> bytes:
    r, p = row.astype(np.int64).tolist(), prior.astype(np.int64).tolist()
    out = []
    for i, x in enumerate(r):
        a = r[i - bpp] if i >= bpp else 0
        c = p[i - bpp] if i >= bpp else 0
        pred = [0, a, p[i], (a + p[i]) // 2, _paeth(a, p[i], c)][ftype]
        out.append((x - pred) & 0xFF)
    return bytes([ftype, *out])


def _chunk(kind: bytes, body: bytes) -> bytes:
    crc = zlib.crc32(kind + body) & 0xFFFFFFFF
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", crc)


def write_png(path, img: np.ndarray, ctype: int | None = None, palette: np.ndarray | None = None) -> None:
    """A PNG encoder cycling through the five filter types row by row (8-bit)."""
    img = np.asarray(img, np.uint8)
    if img.ndim == 2:
        img = img[..., None]
    h, w, c = img.shape
    ctype = ctype if ctype is not None else {1: 0, 2: 4, 3: 2, 4: 6}[c]
    bpp = c
    raw, prior = b"", np.zeros(w * bpp, np.uint8)
    for y in range(h):
        row = img[y].reshape(-1)
        raw += _filter_row(y % 5, row, prior, bpp)
        prior = row
    data = b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, ctype, 0, 0, 0))
    if palette is not None:
        data += _chunk(b"PLTE", palette.astype(np.uint8).tobytes())
    data += _chunk(b"IDAT", zlib.compress(raw)) + _chunk(b"IEND", b"")
    path.write_bytes(data)


@pytest.mark.parametrize("channels", [1, 2, 3, 4])
def test_png_roundtrip_every_filter(tmp_path, channels):
    img = np.random.default_rng(channels).integers(0, 256, (11, 7, channels), dtype=np.uint8)
    write_png(tmp_path / "a.png", img)
    assert np.array_equal(images.read_png(tmp_path / "a.png"), img)


def test_png_palette(tmp_path):
    pal = np.random.default_rng(0).integers(0, 256, (16, 3), dtype=np.uint8)
    idx = np.random.default_rng(1).integers(0, 16, (5, 6), dtype=np.uint8)
    write_png(tmp_path / "p.png", idx, ctype=3, palette=pal)
    assert np.array_equal(images.read_png(tmp_path / "p.png"), pal[idx])


def test_pnm_and_npy(tmp_path):
    img = np.random.default_rng(0).integers(0, 256, (4, 5, 3), dtype=np.uint8)
    (tmp_path / "a.ppm").write_bytes(b"P6\n# comment\n5 4\n255\n" + img.tobytes())
    assert np.array_equal(images.read_image(tmp_path / "a.ppm"), img)
    np.save(tmp_path / "g.npy", img[..., 0])
    assert np.array_equal(images.read_image(tmp_path / "g.npy"), img[..., :1])


def test_not_a_png_raises_value_error(tmp_path):
    (tmp_path / "x.png").write_bytes(b"GIF89a....")
    with pytest.raises(ValueError):
        images.read_png(tmp_path / "x.png")


def test_resize_keeps_constants_and_identity():
    img = np.full((30, 40, 3), 77, np.uint8)
    assert np.all(images.resize(img, 13, 9) == 77)
    rnd = np.random.default_rng(0).integers(0, 256, (8, 9, 1), dtype=np.uint8)
    assert np.array_equal(images.resize(rnd, 8, 9), rnd)


def test_resize_halving_matches_pillows_coefficients():
    # Pillow's bilinear shrinking by 2: triangle of support 2, windows cut at the borders and renormalised
    row = np.array([0, 80, 160, 240, 0, 0, 0, 0], np.uint8).reshape(1, 8, 1)
    assert images.resize(row, 1, 4)[0, :, 0].tolist() == [57, 160, 30, 0]  # 400/7, 1280/8, 240/8, 0


def test_imagenet_preset_geometry_and_normalisation():
    img = np.full((300, 400, 3), 255, np.uint8)
    x = images.preprocess(img, "imagenet", (224, 224), 3)
    assert x.shape == (3, 224, 224) and x.dtype == np.float32
    assert np.allclose(x[:, 0, 0], (1 - np.array([0.485, 0.456, 0.406])) / np.array([0.229, 0.224, 0.225]))
    g = images.preprocess(img, "raw", (8, 8), 1)
    assert g.shape == (1, 8, 8) and np.allclose(g, 1.0)
