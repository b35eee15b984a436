"""The onnxruntime engine: ``int.onnx`` with the custom-op library's exact rewrites applied once
(:mod:`.compile`), run by any onnxruntime session that registers the library (:mod:`.session`); its
:class:`~ivit_onnx.engines.base.Engine` is :mod:`.engine`.

The rewrites, each exact and each a module here: the patch embedding as a GEMM (:mod:`.patch_gemm`), its
per-channel ops on the GEMM's tokens (:mod:`.patch_layout`), GEMM
operands re-encoded as uint8 (:mod:`.u8_gemm`), GEMM bias Adds folded into Requantize (:mod:`.bias_fold`) and
Requantize chains as table lookups (:mod:`.chain_fold`).
"""

from __future__ import annotations

_API = {"Compiled": "compile", "compile_model": "compile", "is_artifact": "compile",
        "InferenceSession": "session"}


def __getattr__(name: str):
    """The API, imported on first use (the registry imports :mod:`.engine` without onnxruntime)."""
    if name in _API:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_API[name]}"), name)
    raise AttributeError(name)


__all__ = ["Compiled", "InferenceSession", "compile_model", "is_artifact"]
