"""The C engine on the host: ``model.c`` compiled with the system C compiler (``$CC``, else ``cc``/``gcc``;
``-std=c99 -O2 -Wall -Wextra -Werror``) into a shared library, run through ctypes behind onnxruntime's session
interface. The float boundary (the input QuantizeLinear, the output DequantizeLinear) runs here in numpy with
ONNX's semantics; the model itself runs sample by sample in C."""

from __future__ import annotations

import ctypes
import json
import os
import re
import shutil
import subprocess
import tempfile

import numpy as np

from ..base import NodeArg, onnx_type

FLAGS = ["-std=c99", "-O2", "-Wall", "-Wextra", "-Werror", "-fno-strict-aliasing"]
_META = re.compile(r"/\* ivit-onnx: (\{.*\}) \*/")


def compiler(where: str = "") -> str:
    """The host C compiler, or a one-line error."""
    from ivit_onnx.errors import ConversionError

    for cc in (os.environ.get("CC"), "cc", "gcc"):
        if cc and shutil.which(cc):
            return cc
    raise ConversionError(
        f"{where + ': ' if where else ''}the C engine needs a C compiler on this machine "
        "(cc or gcc; or set CC)"
    )


def build(c_path: str, out_path: str, extra: list[str] | None = None) -> None:
    """Compile ``c_path`` into the shared library ``out_path``; a compiler error is a one-line error."""
    from ivit_onnx.errors import ConversionError

    cmd = [compiler(), *FLAGS, *(extra or []), "-shared", "-fPIC", c_path, "-o", out_path]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines() or ["?"]
        first = next((ln for ln in lines if "error" in ln), lines[0])
        raise ConversionError(f"{c_path}: the C compiler refused it ({first})")


def quantize(x: np.ndarray, scale, zero_point, dtype) -> np.ndarray:
    """ONNX QuantizeLinear (per tensor): ``saturate(round_half_even(x / scale) + zp)``, in float32."""
    if len(scale) != 1:
        raise ValueError("the C session quantizes per-tensor inputs only; feed the integer input (run_int)")
    info = np.iinfo(dtype)
    q = np.rint(np.asarray(x, np.float32) / np.float32(scale[0])) + np.float32(zero_point[0])
    return np.clip(q, info.min, info.max).astype(dtype)


def dequantize(y: np.ndarray, scale, zero_point) -> np.ndarray:
    """ONNX DequantizeLinear (per tensor): ``(y - zp) * scale`` in float32."""
    if len(scale) != 1:
        raise ValueError(
            "the C session dequantizes per-tensor outputs only; read the integer output (run_int)"
        )
    return (y.astype(np.int32) - np.int32(zero_point[0])).astype(np.float32) * np.float32(scale[0])


class CSession:
    """A compiled C model behind onnxruntime's session interface; ``run`` takes a batch and calls the entry
    once per sample."""

    def __init__(self, library: str, meta: dict, folder: str | None = None):
        self.meta, self._folder = meta, folder
        self._lib = ctypes.CDLL(library)
        self._run = getattr(self._lib, f"{meta['prefix']}_run")
        self._run.restype = ctypes.c_int
        self.inputs, self.outputs = meta["inputs"], meta["outputs"]

    @classmethod
    def from_source(cls, path) -> CSession:
        """Compile the ``model.c`` at ``path`` (its ``model.h`` beside it)."""
        from ivit_onnx.errors import ConversionError

        path = os.fspath(path)
        header = os.path.splitext(path)[0] + ".h"
        try:
            with open(header) as f:
                found = _META.search(f.read())
        except OSError:
            found = None
        if found is None:
            raise ConversionError(
                f"{path}: no {os.path.basename(header)} written by 'ivit-onnx compile' beside it"
            )
        folder = tempfile.mkdtemp(prefix="ivit_c_")
        lib = os.path.join(folder, "model.so")
        build(os.path.abspath(path), lib)
        return cls(lib, json.loads(found.group(1)), folder)

    @classmethod
    def from_text(cls, c: str, h: str, meta: dict) -> CSession:
        folder = tempfile.mkdtemp(prefix="ivit_c_")
        prefix = meta["prefix"]
        for name, text in ((f"{prefix}.c", c), (f"{prefix}.h", h)):
            with open(os.path.join(folder, name), "w") as f:
                f.write(text)
        lib = os.path.join(folder, "model.so")
        build(os.path.join(folder, f"{prefix}.c"), lib)
        return cls(lib, meta, folder)

    def __del__(self):
        if getattr(self, "_folder", None):
            shutil.rmtree(self._folder, ignore_errors=True)

    @staticmethod
    def _arg(b: dict, outer: bool) -> NodeArg:
        dtype = "float32" if b["scale"] is not None else b["dtype"]
        shape = ["batch", *b["shape"][1:]] if outer else list(b["shape"])
        return NodeArg(b["name"], shape, f"tensor({onnx_type(dtype)})")

    def get_inputs(self) -> list[NodeArg]:
        return [self._arg(b, True) for b in self.inputs]

    def get_outputs(self) -> list[NodeArg]:
        return [self._arg(b, True) for b in self.outputs]

    def describe(self) -> str:
        return (
            f"integer-only C99, arena {self.meta['arena_bytes']} bytes, weights {self.meta['weight_bytes']} "
            "bytes"
        )

    def run_int(self, feeds: list[np.ndarray]) -> list[np.ndarray]:
        """One sample: the entry's integer inputs (as the input QuantizeLinear writes them) -> its integer
        outputs (as the output DequantizeLinear reads them)."""
        args, outs = [], []
        for b, x in zip(self.inputs, feeds, strict=True):
            x = np.ascontiguousarray(x, dtype=b["dtype"]).reshape(b["shape"])
            args.append(x)
        for b in self.outputs:
            outs.append(np.zeros(b["shape"], b["dtype"]))
        code = self._run(*[a.ctypes.data_as(ctypes.c_void_p) for a in args + outs])
        if code != 0:
            raise RuntimeError(f"{self.meta['prefix']}_run returned {code}")
        return outs

    def run(self, output_names, input_feed, run_options=None) -> list[np.ndarray]:
        """onnxruntime's ``run``: float inputs quantized as the model's QuantizeLinear does, integer outputs
        dequantized as its DequantizeLinear does; a batch runs sample by sample."""
        missing = [b["name"] for b in self.inputs if b["name"] not in input_feed]
        if missing:
            raise KeyError(f"missing inputs {missing}")
        arrays = []
        for b in self.inputs:
            x = np.asarray(input_feed[b["name"]])
            if list(x.shape[1:]) != b["shape"][1:]:
                raise ValueError(
                    f"input {b['name']}: expected shape [N, {', '.join(map(str, b['shape'][1:]))}], "
                    f"got {list(x.shape)}"
                )
            if b["scale"] is not None:
                x = quantize(x, b["scale"], b["zero_point"], np.dtype(b["dtype"]))
            arrays.append(x)
        batch = arrays[0].shape[0] if arrays else 1
        per = [self.run_int([a[i : i + 1] for a in arrays]) for i in range(batch)]
        outs = {}
        for j, b in enumerate(self.outputs):
            y = np.concatenate([p[j] for p in per], axis=0)
            outs[b["name"]] = dequantize(y, b["scale"], b["zero_point"]) if b["scale"] is not None else y
        return [outs[n] for n in (output_names or outs)]


__all__ = ["CSession", "build", "compiler", "dequantize", "quantize"]
