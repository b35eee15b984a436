"""Paths of the bundled digits demo model (torch-free, so the CLI and tests can use it without torch)."""

from __future__ import annotations

import json
import os
from pathlib import Path

_HERE = Path(__file__).parent
FQ_NAME = "digits_vit_fq.onnx"
FP32_NAME = "digits_vit_fp32.onnx"
INFO_NAME = "digits_vit.json"
#: the name every command accepts for the bundled models (a file of that name wins)
ALIAS = "digits"


def resolve(arg: str, fp32: bool = False) -> str:
    """``digits`` (unless a file of that name exists) names the bundled fake-quant (or FP32) digits ViT."""
    if arg == ALIAS and not os.path.exists(arg):
        return str(default_fp32_path() if fp32 else default_model_path())
    return arg


def default_model_path() -> Path:
    """The bundled fake-quant (QDQ) digits ViT: the demo input of the integer rewrite."""
    return _HERE / FQ_NAME


def default_fp32_path() -> Path:
    """The bundled FP32 digits ViT it was quantized from."""
    return _HERE / FP32_NAME


def default_info_path() -> Path:
    """The JSON beside the bundled models: preprocessing, split, configuration and measured accuracies."""
    return _HERE / INFO_NAME


def load_default_info() -> dict:
    """The bundled models' JSON description, parsed."""
    return json.loads(default_info_path().read_text())
