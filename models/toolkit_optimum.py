"""Hugging Face Optimum's ONNX exporter and ``ORTQuantizer``, with their documented APIs and default options.

Runs inside the isolated Optimum venv (``toolkit_env.OPTIMUM``: optimum-onnx 0.1 needs transformers < 4.58),
never imports the project:

- ``python toolkit_optimum.py export MODEL_DIR TASK OUT_DIR``: ``optimum.exporters.onnx.main_export`` of a
  ``save_pretrained`` folder (no download) to ``OUT_DIR/model.onnx``;
- ``python toolkit_optimum.py quantize MODEL.onnx CALIB.npz OUT.onnx``: ``ORTQuantizer`` static QDQ with
  ``AutoQuantizationConfig.avx512_vnni(is_static=True, per_channel=False)`` and min/max calibration
  (``AutoCalibrationConfig.minmax``), as Optimum's quantization guide does it.

Each prints the versions it ran with as JSON on its last line.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from importlib.metadata import version
from pathlib import Path

import numpy as np
import onnx

IR_VERSION = 10  # onnxruntime 1.31 (the project's) reads IR versions up to 13


def export(model_dir: str, task: str, out_dir: str) -> None:
    from optimum.exporters.onnx import main_export

    main_export(model_dir, output=out_dir, task=task, device="cpu")


class _Calibration(list):
    """The calibration examples (one dict of arrays per example) with the attributes of a
    ``datasets.Dataset`` that Optimum reads (``AutoCalibrationConfig`` records its name; the calibration
    reader only iterates it), so the venv needs no ``datasets``/``pyarrow``."""

    class info:  # noqa: N801
        builder_name, config_name = "ivit-onnx-calibration", None

    split = "train"

    @property
    def num_rows(self) -> int:
        return len(self)


def quantize(onnx_path: str, calib_path: str, out: str) -> None:
    from optimum.onnxruntime import ORTQuantizer
    from optimum.onnxruntime.configuration import AutoCalibrationConfig, AutoQuantizationConfig

    feeds = dict(np.load(calib_path))
    n = len(next(iter(feeds.values())))
    dataset = _Calibration({k: v[i] for k, v in feeds.items()} for i in range(n))
    qconfig = AutoQuantizationConfig.avx512_vnni(is_static=True, per_channel=False)
    quantizer = ORTQuantizer.from_pretrained(Path(onnx_path).parent, file_name=Path(onnx_path).name)
    calibration = AutoCalibrationConfig.minmax(dataset)
    with tempfile.TemporaryDirectory() as tmp:
        ranges = quantizer.fit(
            dataset=dataset,
            calibration_config=calibration,
            operators_to_quantize=qconfig.operators_to_quantize,
            onnx_augmented_model_name=str(Path(tmp) / "augmented.onnx"),
        )
        saved = quantizer.quantize(
            quantization_config=qconfig, save_dir=tmp, calibration_tensors_range=ranges
        )
        shutil.copy(Path(saved) / f"{Path(onnx_path).stem}_quantized.onnx", out)


def main(argv: list[str]) -> None:
    command, *args = argv
    if command == "export":
        export(*args)
        out = str(Path(args[2]) / "model.onnx")
    else:
        quantize(*args)
        out = args[2]
    model = onnx.load(out)
    model.ir_version = min(model.ir_version, IR_VERSION)
    onnx.save(model, out)
    versions = {d: version(d) for d in ("optimum-onnx", "optimum", "transformers", "onnxruntime", "torch")}
    print(json.dumps(versions))


if __name__ == "__main__":
    main(sys.argv[1:])
