"""A TVM artifact (``.so`` with its ``.json`` sidecar) behind onnxruntime's session interface."""

from __future__ import annotations

import os

from ..base import NodeArg, onnx_type


class TvmSession:
    """A TVM artifact behind onnxruntime's session interface (``artifact``: loaded, or just compiled)."""

    def __init__(self, path: str | os.PathLike | None = None, artifact=None):
        from . import compile as tvm_compile

        self._backend = tvm_compile
        self.artifact = artifact if artifact is not None else tvm_compile.load(path)

    @staticmethod
    def _args(specs) -> list[NodeArg]:
        return [NodeArg(s["name"], list(s.get("shape", [])), f"tensor({onnx_type(s['dtype'])})")
                for s in specs]

    def get_inputs(self) -> list[NodeArg]:
        return self._args(self.artifact.inputs)

    def get_outputs(self) -> list[NodeArg]:
        return self._args(self.artifact.outputs)

    def run(self, output_names, input_feed, run_options=None) -> list:
        values = self._backend.run(self.artifact, input_feed)
        values = values if isinstance(values, list | tuple) else [values]
        outs = dict(zip((o["name"] for o in self.artifact.outputs), values, strict=True))
        return [outs[n] for n in (output_names or outs)]

    def describe(self) -> str:
        kind = self.artifact.target.get("kind")
        return f"{kind} build, {self.artifact.info.get('int8_matmuls')} int8 matmuls"


__all__ = ["TvmSession"]
