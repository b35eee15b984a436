"""Optimum's ONNX exporter and ``ORTQuantizer`` on a ``transformers`` model, run in the isolated Optimum venv
(``toolkit_env.OPTIMUM``; the script is ``toolkit_optimum.py``). The model travels as a ``save_pretrained``
folder, so both sides read the same config and weights."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import numpy as np

from .hf import SPECS
from .toolkit_env import OPTIMUM, run_script

SCRIPT = Path(__file__).with_name("toolkit_optimum.py")


def optimum_export(model, family: str, out_path: str | Path) -> dict:
    """``optimum.exporters.onnx.main_export`` (its default opset, task from ``hf.SPECS``) of ``model`` to
    ``out_path``; returns the versions it ran with."""
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(Path(tmp) / "model")
        versions = run_script(
            OPTIMUM,
            SCRIPT,
            "export",
            str(Path(tmp) / "model"),
            SPECS[family].task,
            str(Path(tmp) / "onnx"),
            cwd=tmp,
        )
        shutil.copy(Path(tmp) / "onnx" / "model.onnx", out_path)
    return versions


def optimum_quantize(fp32_path: str | Path, calib: list[dict[str, np.ndarray]], out_path: str | Path) -> dict:
    """``ORTQuantizer`` static QDQ (``avx512_vnni`` config, per tensor, min/max) of an FP32 file, calibrated
    on the examples of ``calib`` (batches of feeds); returns the versions it ran with."""
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "model.onnx"
        shutil.copy(fp32_path, model)
        calib_path = Path(tmp) / "calib.npz"
        np.savez(calib_path, **{k: np.concatenate([b[k] for b in calib]) for k in calib[0]})
        return run_script(OPTIMUM, SCRIPT, "quantize", str(model), str(calib_path), str(out_path), cwd=tmp)
