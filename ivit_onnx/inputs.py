"""Validation inputs: random tensors, an ``.npz`` of arrays, the bundled digits split, or a folder of images.

* random (default): ``N(0, 1)`` for float inputs, uniform over the type for integer ones, seeded;
* ``.npz``: one array per model input (keys = input names), or a single array for a one-input model;
  an optional ``labels`` array of class indices;
* ``digits``: scikit-learn's digits test split (:mod:`ivit_onnx.models.digits`), with labels;
* a folder: images (:mod:`ivit_onnx.images`) preprocessed by a preset; when the folder has sub-folders,
  each is a class and its index in sorted order is the label (torchvision's ImageFolder convention).
"""

from __future__ import annotations

import os
import struct
import zipfile
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import helper

from . import images
from .errors import ConversionError, one_line


class InputError(ConversionError):
    """Unusable validation input; ``str(err)`` is one line."""


@dataclass(frozen=True)
class InputSpec:
    name: str
    dtype: np.dtype
    shape: tuple  # ints, None for symbolic dims

    def describe(self) -> str:
        dims = ", ".join("?" if d is None else str(d) for d in self.shape)
        return f"{self.name}: {self.dtype.name}[{dims}]"


def input_specs(model: onnx.ModelProto) -> list[InputSpec]:
    """What the model has to be fed (graph inputs that are not initializers)."""
    inits = {t.name for t in model.graph.initializer}
    out = []
    for i in model.graph.input:
        if i.name in inits:
            continue
        tt = i.type.tensor_type
        if not tt.elem_type:
            raise InputError(f"input '{i.name}' is not a tensor")
        dims = tuple(d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim)
        if any(d is not None and d < 1 for d in dims):
            raise InputError(f"input '{i.name}' has an empty or negative dimension {list(dims)}")
        out.append(InputSpec(i.name, np.dtype(helper.tensor_dtype_to_np_dtype(tt.elem_type)), dims))
    return out


@dataclass
class Dataset:
    """``count`` samples served batch by batch: ``batches(n)`` yields ``(feeds, labels or None)``."""

    description: str
    count: int
    get: Callable[[int, int], dict[str, np.ndarray]]
    labels: np.ndarray | None = None

    def batches(self, size: int) -> Iterator[tuple[dict[str, np.ndarray], np.ndarray | None]]:
        for start in range(0, self.count, size):
            end = min(start + size, self.count)
            yield self.get(start, end), None if self.labels is None else self.labels[start:end]


def _sample_shape(spec: InputSpec) -> tuple:
    rest = spec.shape[1:]
    if any(d is None for d in rest):
        raise InputError(f"input {spec.describe()} has symbolic non-batch dimensions: give --data")
    return rest


def random_dataset(specs: list[InputSpec], count: int, seed: int) -> Dataset:
    rng = np.random.default_rng(seed)
    arrays = {}
    for s in specs:
        shape = (count, *_sample_shape(s))
        if s.dtype.kind == "f":
            arrays[s.name] = rng.standard_normal(shape).astype(s.dtype)
        elif s.dtype.kind in "iu":
            info = np.iinfo(s.dtype)
            arrays[s.name] = rng.integers(info.min, info.max, shape, endpoint=True, dtype=s.dtype)
        elif s.dtype.kind == "b":
            arrays[s.name] = rng.integers(0, 2, shape).astype(bool)
        else:
            raise InputError(f"cannot make random values for input {s.describe()}")
    kind = "N(0,1)" if all(s.dtype.kind == "f" for s in specs) else "uniform"
    desc = f"random {kind}, seed {seed}"
    return _from_arrays(desc, specs, arrays, None)


def _from_arrays(desc: str, specs: list[InputSpec], arrays: dict, labels) -> Dataset:
    counts = {len(a) for a in arrays.values()}
    if len(counts) != 1:
        raise InputError(f"{desc}: arrays have different first dimensions {sorted(counts)}")
    n = counts.pop()
    for s in specs:
        a = arrays[s.name]
        want = s.shape[1:]  # symbolic dims (None) take the array's size
        fits = a.ndim == len(s.shape) and all(w in (None, d) for w, d in zip(want, a.shape[1:], strict=False))
        if not fits:
            raise InputError(f"{desc}: array for '{s.name}' has samples of shape {list(a.shape[1:])}, "
                             f"the model wants {['?' if w is None else w for w in want]}")
        if a.dtype != s.dtype:
            if a.dtype.kind not in "iufb":
                raise InputError(f"{desc}: array for '{s.name}' has dtype {a.dtype}")
            arrays[s.name] = a.astype(s.dtype)
    if labels is not None:
        labels = np.asarray(labels)
        if labels.dtype.kind not in "iu" or labels.shape != (n,):
            raise InputError(f"{desc}: labels must be {n} integers, got {labels.dtype}{list(labels.shape)}")
        labels = labels.astype(np.int64)
    return Dataset(desc, n, lambda a, b: {k: v[a:b] for k, v in arrays.items()}, labels)


def npz_dataset(path: str, specs: list[InputSpec]) -> Dataset:
    try:
        with np.load(path, allow_pickle=False) as z:
            data = {k: z[k] for k in z.files}
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as e:
        raise InputError(f"{path}: not a readable .npz ({one_line(e)})") from None
    labels = data.pop("labels", None)
    names = [s.name for s in specs]
    if set(names) <= set(data):
        arrays = {k: data[k] for k in names}
    elif len(data) == 1 and len(specs) == 1:
        arrays = {names[0]: next(iter(data.values()))}
    else:
        raise InputError(f"{path}: keys {sorted(data)} do not name the model inputs {names}")
    if any(a.ndim == 0 for a in arrays.values()):
        raise InputError(f"{path}: arrays need a leading sample dimension")
    return _from_arrays(os.path.basename(path), specs, arrays, labels)


def digits_dataset(specs: list[InputSpec]) -> Dataset:
    try:
        from ivit_onnx.models.digits import load_digits_split

        _, _, x, y = load_digits_split()
    except ImportError as e:
        raise InputError(f"--data digits needs scikit-learn ({e.name or e}): pip install 'ivit-onnx[models]' "
                         "(or pip install scikit-learn)") from None
    if len(specs) != 1:
        raise InputError("--data digits needs a model with one input")
    return _from_arrays("digits test split", specs, {specs[0].name: x}, y)


def folder_dataset(path: str, specs: list[InputSpec], preset: str) -> Dataset:
    if len(specs) != 1 or len(specs[0].shape) != 4:
        raise InputError("an image folder needs a model with one NCHW input")
    _, c, h, w = specs[0].shape
    if c is None:
        raise InputError(f"input {specs[0].describe()}: the channel count must be static for images")
    size = (h or 224, w or 224)
    root, ok = Path(path), images.suffixes()
    classes = sorted(d.name for d in root.iterdir() if d.is_dir())
    files, labels = [], []
    for label, sub in enumerate(classes or [""]):
        found = sorted(p for p in (root / sub).rglob("*") if p.is_file() and p.suffix.lower() in ok)
        files += found
        labels += [label] * len(found)
    if not files:
        raise InputError(f"{path}: no images ({', '.join(ok)})")
    spec = specs[0]

    def get(a: int, b: int) -> dict[str, np.ndarray]:
        batch = []
        for f in files[a:b]:
            try:
                batch.append(images.preprocess(images.read_image(f), preset, size, c))
            except (OSError, ValueError, KeyError, IndexError, struct.error, zlib.error) as e:
                raise InputError(f"{f}: unreadable image ({e})") from None
        return {spec.name: np.stack(batch).astype(spec.dtype)}

    desc = f"{path} ({len(files)} images{f', {len(classes)} classes' if classes else ''}, preset {preset})"
    return Dataset(desc, len(files), get, np.asarray(labels, np.int64) if classes else None)


def load_dataset(data: str | None, specs: list[InputSpec], count: int, seed: int, preset: str,
                 limit: int | None = None) -> Dataset:
    """The dataset named by ``--data`` (None: ``count`` random samples)."""
    if data is None:
        ds = random_dataset(specs, count, seed)
    elif data == "digits":
        ds = digits_dataset(specs)
    elif os.path.isdir(data):
        ds = folder_dataset(data, specs, preset)
    elif os.path.isfile(data):
        ds = npz_dataset(data, specs)
    else:
        raise InputError(f"{data}: no such file or folder")
    if limit is not None and limit < ds.count:
        ds.count = limit
    return ds
