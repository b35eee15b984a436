"""Numpy-only image reading and classification preprocessing (no Pillow needed).

Readers: ``.png`` (8/16-bit, grey/RGB/palette/alpha, not interlaced), binary ``.pgm``/``.ppm``, and
``.npy`` (H×W or H×W×C pixel values 0..255); other formats (JPEG...) only when Pillow is importable.
Resizing is Pillow's antialiased bilinear filter (triangle kernel widened by the downscale factor,
horizontal pass then vertical, each rounded to 8 bits), so presets match torchvision's PIL pipeline
to within a grey level.
"""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import numpy as np

NATIVE_SUFFIXES = (".png", ".pgm", ".ppm", ".npy")
PIL_SUFFIXES = (".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp")

#: name -> (crop fraction, mean, std); the resize is ``size / crop``, then a centre crop of ``size``
PRESETS = {
    "imagenet": (0.875, (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),  # resize 256, crop 224
    "inception": (0.875, (0.5, 0.5, 0.5), (0.5, 0.5, 0.5)),  # same geometry, [-1, 1] range
    "raw": (1.0, (0.0, 0.0, 0.0), (1.0, 1.0, 1.0)),  # resize to the input size, [0, 1] range
}


def suffixes() -> tuple[str, ...]:
    """The image file suffixes this process can read."""
    try:
        import PIL.Image  # noqa: F401

        return NATIVE_SUFFIXES + PIL_SUFFIXES
    except ImportError:
        return NATIVE_SUFFIXES


def _unfilter(raw: bytes, h: int, stride: int, bpp: int) -> np.ndarray:
    """Undo PNG's per-row filters (None, Sub, Up, Average, Paeth)."""
    out = np.zeros((h, stride), np.uint8)
    prior = np.zeros(stride, np.int32)
    pos = 0
    for y in range(h):
        ftype, row = raw[pos], np.frombuffer(raw, np.uint8, stride, pos + 1).astype(np.int32)
        pos += stride + 1
        if ftype == 0:
            cur = row
        elif ftype == 1:  # Sub: running sum of pixels, per byte of a pixel
            pad = (-stride) % bpp
            cur = (np.cumsum(np.concatenate([row, np.zeros(pad, np.int32)]).reshape(-1, bpp), 0)
                   .reshape(-1)[:stride] & 0xFF)
        elif ftype == 2:
            cur = (row + prior) & 0xFF
        elif ftype in (3, 4):
            r, p, c = row.tolist(), prior.tolist(), [0] * stride
            for i in range(stride):
                a = c[i - bpp] if i >= bpp else 0
                b = p[i]
                if ftype == 3:
                    c[i] = (r[i] + ((a + b) >> 1)) & 0xFF
                else:
                    cc = p[i - bpp] if i >= bpp else 0
                    pa, pb, pc = abs(b - cc), abs(a - cc), abs(a + b - 2 * cc)
                    c[i] = (r[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else cc)) & 0xFF
            cur = np.array(c, np.int32)
        else:
            raise ValueError(f"bad PNG filter type {ftype}")
        out[y] = cur
        prior = cur
    return out


def read_png(path) -> np.ndarray:
    """A PNG as uint8 H×W×C (C = 1, 2, 3 or 4; palette images expanded to RGB/RGBA)."""
    data = Path(path).read_bytes()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG file")
    pos, idat, plte, trns, hdr = 8, [], None, None, None
    while pos + 8 <= len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if len(body) != length:
            raise ValueError("truncated PNG")
        if kind == b"IHDR":
            hdr = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat.append(body)
        elif kind == b"PLTE":
            plte = np.frombuffer(body, np.uint8).reshape(-1, 3)
        elif kind == b"tRNS":
            trns = np.frombuffer(body, np.uint8)
        elif kind == b"IEND":
            break
        pos += 12 + length
    if hdr is None:
        raise ValueError("PNG without IHDR")
    w, h, depth, ctype, _, _, interlace = hdr
    if interlace:
        raise ValueError("interlaced PNG is not supported")
    channels = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}[ctype]
    if depth not in (8, 16) or (ctype == 3 and depth != 8):
        raise ValueError(f"PNG bit depth {depth} is not supported (8 or 16)")
    bpp = channels * depth // 8
    px = _unfilter(zlib.decompress(b"".join(idat)), h, w * bpp, bpp)
    px = px.reshape(h, w, channels, depth // 8)[..., 0]  # 16-bit: the high byte
    if ctype == 3:
        if plte is None:
            raise ValueError("palette PNG without PLTE")
        idx = px[..., 0]
        rgb = plte[np.minimum(idx, len(plte) - 1)]
        if trns is not None:
            alpha = np.full(256, 255, np.uint8)
            alpha[: len(trns)] = trns
            return np.concatenate([rgb, alpha[idx][..., None]], axis=-1)
        return rgb
    return px


def read_pnm(path) -> np.ndarray:
    """A binary PGM (P5) or PPM (P6) with maxval ≤ 255, as uint8 H×W×C."""
    data = Path(path).read_bytes()
    fields, pos = [], 0
    while len(fields) < 4:
        while data[pos:pos + 1].isspace():
            pos += 1
        if data[pos:pos + 1] == b"#":
            pos = data.index(b"\n", pos)
            continue
        end = pos
        while not data[end:end + 1].isspace():
            end += 1
        fields.append(data[pos:end])
        pos = end
    magic, w, h, maxval = fields[0], int(fields[1]), int(fields[2]), int(fields[3])
    if magic not in (b"P5", b"P6") or maxval > 255:
        raise ValueError("only binary 8-bit PGM (P5) / PPM (P6) are supported")
    c = 1 if magic == b"P5" else 3
    return np.frombuffer(data, np.uint8, w * h * c, pos + 1).reshape(h, w, c)


def read_image(path) -> np.ndarray:
    """Pixels of one image file as uint8 H×W×C."""
    suffix = Path(path).suffix.lower()
    if suffix == ".png":
        img = read_png(path)
    elif suffix in (".pgm", ".ppm"):
        img = read_pnm(path)
    elif suffix == ".npy":
        img = np.load(path, allow_pickle=False)
        img = np.clip(np.rint(img) if img.dtype.kind == "f" else img, 0, 255).astype(np.uint8)
    else:
        from PIL import Image

        with Image.open(path) as im:
            img = np.asarray(im.convert("RGB"))
    return img[..., None] if img.ndim == 2 else img


def to_channels(img: np.ndarray, c: int) -> np.ndarray:
    """Drop alpha and convert grey/RGB to ``c`` channels (ITU-R 601 luma for grey, as Pillow's ``L``)."""
    if img.shape[-1] in (2, 4):
        img = img[..., :-1]
    if img.shape[-1] == c:
        return img
    if c == 3:
        return np.repeat(img, 3, axis=-1)
    if c == 1:
        luma = img.astype(np.float64) @ np.array([0.299, 0.587, 0.114])
        return np.clip(np.rint(luma), 0, 255).astype(np.uint8)[..., None]
    raise ValueError(f"cannot make {c} channels from {img.shape[-1]}")


def _weights(n_in: int, n_out: int) -> np.ndarray:
    """Pillow's bilinear resampling matrix [n_out, n_in] (antialiased when shrinking)."""
    scale = n_in / n_out
    support = max(scale, 1.0)
    w = np.zeros((n_out, n_in))
    for i in range(n_out):
        centre = (i + 0.5) * scale
        lo, hi = max(int(centre - support + 0.5), 0), min(int(centre + support + 0.5), n_in)
        x = (np.arange(lo, hi) - centre + 0.5) / support
        k = np.maximum(0.0, 1.0 - np.abs(x))
        w[i, lo:hi] = k / k.sum() if k.sum() else 0
    return w


def resize(img: np.ndarray, h: int, w: int) -> np.ndarray:
    """Bilinear (antialiased) resize of uint8 H×W×C to h×w, as Pillow does it."""
    out = img.astype(np.float64)
    if out.shape[1] != w:
        out = np.clip(np.rint(np.einsum("ox,hxc->hoc", _weights(out.shape[1], w), out)), 0, 255)
    if out.shape[0] != h:
        out = np.clip(np.rint(np.einsum("oy,ywc->owc", _weights(out.shape[0], h), out)), 0, 255)
    return out.astype(np.uint8)


def preprocess(img: np.ndarray, preset: str, size: tuple[int, int], channels: int) -> np.ndarray:
    """uint8 H×W×C pixels -> float32 C×H×W: shorter side to ``size / crop``, centre crop, mean/std."""
    crop, mean, std = PRESETS[preset]
    th, tw = size
    img = to_channels(img, channels)
    if crop == 1.0:
        img = resize(img, th, tw)
    else:
        short = int(round(min(th, tw) / crop))
        h, w = img.shape[:2]
        nh, nw = (short, int(short * w / h)) if h <= w else (int(short * h / w), short)
        img = resize(img, nh, nw)
        top, left = int(round((nh - th) / 2.0)), int(round((nw - tw) / 2.0))
        img = img[top:top + th, left:left + tw]
    x = img.astype(np.float32) / 255.0
    m = np.asarray(mean[:channels] if channels <= 3 else mean, np.float32)
    s = np.asarray(std[:channels] if channels <= 3 else std, np.float32)
    return ((x - m) / s).transpose(2, 0, 1).astype(np.float32)
