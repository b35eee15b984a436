"""QDQ models made by onnxruntime's own quantizer (`quantize_static`) from an FP32 export."""

from __future__ import annotations

import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
import onnx
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
from onnxruntime.quantization.shape_inference import quant_pre_process

IR_VERSION = 10  # onnxruntime 1.31 reads IR versions up to 13; match models/export.py

#: The three QDQ flavours the converter must accept.
VARIANTS = {
    # symmetric int8 activations, symmetric per-channel int8 weights, every supported op quantized
    "int8_sym": dict(
        activation_type=QuantType.QInt8,
        weight_type=QuantType.QInt8,
        per_channel=True,
        extra_options={"ActivationSymmetric": True, "WeightSymmetric": True},
    ),
    # asymmetric uint8 activations, per-tensor int8 weights
    "uint8_asym": dict(
        activation_type=QuantType.QUInt8,
        weight_type=QuantType.QInt8,
        per_channel=False,
        extra_options={"ActivationSymmetric": False, "WeightSymmetric": True},
    ),
    # TensorRT style: only the inputs of MatMul/Gemm/Conv get Q/DQ (symmetric int8, per-channel weights);
    # without OpTypesToExcludeOutputQuantization onnxruntime would quantize their outputs as well
    "partial": dict(
        activation_type=QuantType.QInt8,
        weight_type=QuantType.QInt8,
        per_channel=True,
        op_types_to_quantize=["MatMul", "Gemm", "Conv"],
        extra_options={
            "ActivationSymmetric": True,
            "WeightSymmetric": True,
            "OpTypesToExcludeOutputQuantization": ["MatMul", "Gemm", "Conv"],
        },
    ),
}


class _Reader(CalibrationDataReader):
    """Feeds calibration batches to onnxruntime's calibrator: an array goes under the model's (first) input
    name as float32; a dict of arrays (a multi-input model such as ``models.bert``) is fed as it is."""

    def __init__(self, input_name: str, batches: Iterable[np.ndarray | dict[str, np.ndarray]]):
        self._feeds: Iterator[dict[str, np.ndarray]] = (
            b if isinstance(b, dict) else {input_name: np.ascontiguousarray(b, dtype=np.float32)}
            for b in batches
        )

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._feeds, None)


def ort_quantize(
    fp32_path: str | Path,
    out_path: str | Path,
    calib_batches: Iterable[np.ndarray | dict[str, np.ndarray]],
    variant: str = "int8_sym",
    preprocess: bool = True,
) -> onnx.ModelProto:
    """QDQ-quantize an FP32 ONNX model with onnxruntime's `quantize_static` (min/max calibration).

    variant: "int8_sym", "uint8_asym" or "partial" (see VARIANTS). preprocess: first run onnxruntime's
    recommended `quant_pre_process` (shape inference and basic graph optimizations such as folding
    shape computations and Identity nodes; no contrib-op fusions). The result is saved to `out_path`
    with IR version 10 and returned.
    """
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {sorted(VARIANTS)}, got {variant!r}")
    with tempfile.TemporaryDirectory() as tmp:
        if preprocess:
            pre_path = Path(tmp) / "preprocessed.onnx"
            quant_pre_process(str(fp32_path), str(pre_path))
            fp32_path = pre_path
        model = onnx.load(str(fp32_path))
        reader = _Reader(model.graph.input[0].name, calib_batches)
        quantize_static(model, str(out_path), reader, quant_format=QuantFormat.QDQ, **VARIANTS[variant])
    quantized = onnx.load(str(out_path))
    quantized.ir_version = min(quantized.ir_version, IR_VERSION)
    onnx.save(quantized, str(out_path))
    return quantized
