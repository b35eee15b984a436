"""``ivit_onnx.InferenceSession``: the fast exact session on any engine's artifact, with onnxruntime's
interface (``run(output_names, feeds)``, ``get_inputs()``, ``get_outputs()``), so it drops into existing code.
The engine is the registry's for the artifact's suffix (:func:`ivit_onnx.engines.for_artifact`):

* an ``.onnx`` (the onnxruntime engine's artifact, or ``int.onnx`` as converted, compiled in memory):
  :class:`ivit_onnx.engines.onnxruntime.InferenceSession`;
* a ``.so`` with its ``.json`` sidecar (``ivit-onnx compile --engine tvm``):
  :class:`ivit_onnx.engines.tvm.session.TvmSession`.
"""

from __future__ import annotations

from .engines import for_artifact
from .engines.base import NodeArg


def InferenceSession(path, threads: int | None = None, **kwargs):  # noqa: N802 - onnxruntime's name
    """The fast exact session on ``path``: the artifact of the engine its suffix names (an ``.onnx``, its
    artifact or ``int.onnx`` compiled in memory, or a ModelProto: onnxruntime; ``threads``: intra-op
    threads)."""
    engine = for_artifact(path)
    return engine.load(path, threads, **kwargs) if kwargs else engine.load(path, threads)


def __getattr__(name: str):
    if name == "TvmSession":  # moved into the TVM engine's folder
        from .engines.tvm.session import TvmSession

        return TvmSession
    raise AttributeError(name)


__all__ = ["InferenceSession", "NodeArg", "TvmSession"]  # noqa: F822 - TvmSession: module __getattr__
