"""``ivit_onnx.InferenceSession``: the fast exact session on either engine's artifact, with onnxruntime's
interface (``run(output_names, feeds)``, ``get_inputs()``, ``get_outputs()``), so it drops into existing code.

* an ``.onnx`` (the onnxruntime engine's artifact, or ``int.onnx`` as converted, compiled in memory):
  :class:`ivit_onnx.engines.onnxruntime.InferenceSession`;
* a ``.so`` with its ``.json`` sidecar (``ivit-onnx compile --engine tvm``): :class:`TvmSession`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class NodeArg:
    """onnxruntime's ``NodeArg`` shape: a graph input's or output's name, shape and type string."""

    name: str
    shape: list
    type: str


class TvmSession:
    """A TVM artifact behind onnxruntime's session interface."""

    def __init__(self, path: str | os.PathLike):
        from ivit_onnx.engines.tvm import compile as tvm_compile

        self._backend = tvm_compile
        self.artifact = tvm_compile.load(path)

    @staticmethod
    def _args(specs) -> list[NodeArg]:
        return [NodeArg(s["name"], list(s["shape"]), f"tensor({_onnx_type(s['dtype'])})") for s in specs]

    def get_inputs(self) -> list[NodeArg]:
        return self._args(self.artifact.inputs)

    def get_outputs(self) -> list[NodeArg]:
        return self._args(self.artifact.outputs)

    def run(self, output_names, input_feed, run_options=None) -> list:
        values = self._backend.run(self.artifact, input_feed)
        outs = dict(zip((o["name"] for o in self.artifact.outputs), values, strict=True))
        return [outs[n] for n in (output_names or outs)]


def _onnx_type(dtype: str) -> str:
    return {"float32": "float", "float16": "float16", "float64": "double"}.get(dtype, dtype)


def InferenceSession(path, threads: int | None = None, **kwargs):  # noqa: N802 - onnxruntime's name
    """The fast exact session on ``path``: a TVM ``.so`` artifact, or an ``.onnx`` for the onnxruntime engine
    (its artifact, or ``int.onnx`` compiled in memory; ``threads``: intra-op threads)."""
    if not hasattr(path, "SerializeToString") and Path(os.fspath(path)).suffix == ".so":
        return TvmSession(path)
    from ivit_onnx.engines.onnxruntime import InferenceSession as OrtSession

    return OrtSession(path, threads, **kwargs)


__all__ = ["InferenceSession", "NodeArg", "TvmSession"]
