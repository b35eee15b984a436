"""The onnxruntime engine: ``int.onnx`` with the custom-op library's exact rewrites applied once
(:mod:`.compile`), run by any onnxruntime session that registers the library (:mod:`.session`).

The rewrites, each exact and each a module here: the patch embedding as a GEMM (:mod:`.patch_gemm`), GEMM
operands re-encoded as uint8 (:mod:`.u8_gemm`), GEMM bias Adds folded into Requantize (:mod:`.bias_fold`) and
Requantize chains as table lookups (:mod:`.chain_fold`).
"""

from .compile import Compiled, compile_model, is_artifact
from .session import InferenceSession

__all__ = ["Compiled", "InferenceSession", "compile_model", "is_artifact"]
