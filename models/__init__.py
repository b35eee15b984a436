"""Models for ivit-onnx: plain-torch ViT/DeiT/Swin, fake quantization, ONNX export, the bundled digits demo.

Importing this package is light (no torch): the bundled-model helpers are imported eagerly, everything
else is loaded from its submodule on first attribute access (the table below is the public surface).
"""

from __future__ import annotations

import importlib

from .bundled import default_fp32_path, default_info_path, default_model_path, load_default_info

_LAZY = {
    # digits.py (numpy, scikit-learn, onnxruntime)
    "load_digits_split": "digits",
    "onnx_accuracy": "digits",
    # vit.py (torch)
    "VisionTransformer": "vit",
    "vit": "vit",
    "vit_tiny_patch16_224": "vit",
    "deit_tiny_patch16_224": "vit",
    "deit_small_patch16_224": "vit",
    "deit_base_patch16_224": "vit",
    "deit_tiny_distilled_patch16_224": "vit",
    # swin.py (torch)
    "SwinTransformer": "swin",
    "swin": "swin",
    "swin_tiny_test": "swin",
    "swin_tiny_patch4_window7_224": "swin",
    # quant.py, export.py (torch)
    "quantize": "quant",
    "act_quantizers": "quant",
    # qat.py (torch): QAT whose forward is the integer graph
    "qat": "qat",
    "IntegerViT": "qat",
    "export_onnx": "export",
    # runtime.py (onnxruntime)
    "ort_session": "runtime",
    "run_onnx": "runtime",
    "cosine": "runtime",
    # ort_qdq.py (onnxruntime)
    "ort_quantize": "ort_qdq",
}

__all__ = [
    "default_fp32_path",
    "default_info_path",
    "default_model_path",
    "load_default_info",
    *_LAZY,
]


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
