"""The engines that run an integer model fast, one folder each, and the one registry of them:
:mod:`.onnxruntime` (the custom-op library and its exact rewrites, compiled to an ``.onnx`` artifact), TVM
(``ivit_onnx.engines.tvm``: CUDA int8 and llvm builds, ``.so``) and C (:mod:`.c`: self-contained integer-only
C99 for microcontrollers, ``.c``).

Each engine is an :class:`.base.Engine` (name, artifact suffix, compile arguments, ``compile``, ``load``);
``ivit-onnx compile/run/bench``, validate's library backend and :class:`ivit_onnx.InferenceSession` read
:data:`ENGINES`. Adding an engine is one folder plus one line here.
"""

from __future__ import annotations

from .base import Engine, NodeArg
from .c.engine import CEngine
from .onnxruntime.engine import OnnxruntimeEngine
from .tvm.engine import TvmEngine

#: every engine by name, in ``ivit-onnx bench``'s row order
ENGINES: dict[str, Engine] = {e.name: e for e in (OnnxruntimeEngine(), TvmEngine(), CEngine())}


def by_suffix(path) -> Engine | None:
    """The engine whose artifacts end like ``path``, or None."""
    import os

    suffix = os.path.splitext(os.fspath(path))[1]
    return next((e for e in ENGINES.values() if e.suffix == suffix), None)


def for_artifact(path) -> Engine:
    """The engine that runs the artifact ``path`` (a ModelProto or any other suffix: onnxruntime)."""
    if hasattr(path, "SerializeToString"):
        return ENGINES["onnxruntime"]
    return by_suffix(path) or ENGINES["onnxruntime"]


__all__ = ["ENGINES", "Engine", "NodeArg", "by_suffix", "for_artifact"]
