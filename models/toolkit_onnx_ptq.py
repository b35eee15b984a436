"""ONNX post-training quantization by NVIDIA ModelOpt or AMD Quark, with each toolkit's documented API.

Runs inside the isolated toolkit venv (``toolkit_env.py``), never imports the project:
``python toolkit_onnx_ptq.py RECIPE FP32.onnx CALIB.npy OUT.onnx`` (RECIPE: a key of TOOLS); prints the
versions it ran with as JSON on its last line. int8 wherever the toolkit places Q/DQ, CPU only.
"""

from __future__ import annotations

import json
import sys
from importlib.metadata import version

import numpy as np
import onnx

IR_VERSION = 10  # onnxruntime 1.31 (the project's) reads IR versions up to 13


def modelopt(fp32: str, calib: np.ndarray, out: str, all_gemms: bool = False) -> None:
    """``modelopt.onnx.quantization.quantize`` int8 (TensorRT's QDQ placement), calibrated on the CPU EP;
    ``high_precision_dtype="fp32"`` keeps the unquantized ops float32 (its default converts them to fp16).
    ``all_gemms``: ``enable_gemv_detection_for_trt=False``, so GEMMs with fewer than 16 outputs (a
    10-class head) are quantized too instead of left float."""
    from modelopt.onnx.quantization import quantize

    extra = {"enable_gemv_detection_for_trt": False} if all_gemms else {}

    quantize(
        fp32,
        quantize_mode="int8",
        calibration_data=calib,
        calibration_method="max",
        calibration_eps=["cpu"],
        high_precision_dtype="fp32",
        output_path=out,
        log_level="WARNING",
        **extra,
    )


class _Reader:
    """onnxruntime-style calibration reader over one array, in batches of 64."""

    def __init__(self, name: str, x: np.ndarray):
        self._it = iter([{name: x[i : i + 64]} for i in range(0, len(x), 64)])

    def get_next(self):
        return next(self._it, None)

    def rewind(self):  # Quark's reader protocol; min/max calibration reads the data once
        pass


def quark(fp32: str, calib: np.ndarray, out: str) -> None:
    """``quark.onnx.ModelQuantizer`` with ``QConfig(global_config=QLayerConfig(activation, weight))``: int8
    QDQ, the bundled model's recipe (min/max activations, per-channel weights; Quark's default Int8Spec
    is percentile-calibrated and per tensor)."""
    from quark.onnx import ModelQuantizer, QConfig
    from quark.onnx.quantization.config.spec import CalibMethod, Int8Spec, QLayerConfig, QuantGranularity

    name = onnx.load(fp32, load_external_data=False).graph.input[0].name
    activation = Int8Spec(calibration_method=CalibMethod.MinMax)
    weight = Int8Spec(calibration_method=CalibMethod.MinMax, quant_granularity=QuantGranularity.Channel)
    config = QConfig(global_config=QLayerConfig(activation=activation, weight=weight))
    ModelQuantizer(config).quantize_model(fp32, out, _Reader(name, calib))


def modelopt_defaults(fp32: str, calib: np.ndarray, out: str) -> None:
    """``modelopt.onnx.quantization.quantize`` int8 with every other option its default, as a user first runs
    it: its default ``high_precision_dtype="fp16"`` turns what it leaves unquantized (the 10-class head) into
    float16."""
    from modelopt.onnx.quantization import quantize

    quantize(fp32, quantize_mode="int8", calibration_data=calib, calibration_eps=["cpu"], output_path=out)


TOOLS = {
    "modelopt": (modelopt, "nvidia-modelopt"),
    "modelopt_defaults": (modelopt_defaults, "nvidia-modelopt"),
    "modelopt_all_gemms": (lambda *a: modelopt(*a, all_gemms=True), "nvidia-modelopt"),
    "quark": (quark, "amd-quark"),
}


def main(argv: list[str]) -> None:
    tool, fp32, calib_path, out = argv
    run, dist = TOOLS[tool]
    run(fp32, np.load(calib_path), out)
    model = onnx.load(out)
    model.ir_version = min(model.ir_version, IR_VERSION)
    onnx.save(model, out)
    versions = {"tool": dist, "version": version(dist), "onnx": onnx.__version__}
    versions["onnxruntime"] = version("onnxruntime")
    print(json.dumps(versions))


if __name__ == "__main__":
    main(sys.argv[1:])
