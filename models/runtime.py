"""onnxruntime helpers shared by tests, the digits benchmark and export checks (torch-free)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx

# onnxruntime 1.31's QDQ propagation (extended optimizations) inserts QuantizeLinear nodes with an
# `output_dtype` attribute into opset-21 graphs, then rejects them ("output_dtype INT8 does not match
# y_zero_point type UINT8", onnxruntime issue #25526). Moving Q/DQ across Reshape/Transpose does not
# change results, so sessions here simply skip that transformer.
ORT_DISABLED_OPTIMIZERS = ["QDQPropagationTransformer"]


def ort_session(model: str | Path | onnx.ModelProto):
    """A CPU onnxruntime session that also loads opset-21 QDQ models (see ORT_DISABLED_OPTIMIZERS) and runs a
    fake-quant model's Q/DQ in float, as the model defines them, on every CPU (``runners.simulate_qdq``)."""
    import onnxruntime as ort

    from ivit_onnx.runners import simulate_qdq

    opts = ort.SessionOptions()
    simulate_qdq(opts)
    data = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
    return ort.InferenceSession(
        data, opts, providers=["CPUExecutionProvider"], disabled_optimizers=ORT_DISABLED_OPTIMIZERS
    )


def run_onnx(model: str | Path | onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    """Run a single-input model on the CPU in onnxruntime and return its first output."""
    session = ort_session(model)
    return session.run(None, {session.get_inputs()[0].name: x})[0]


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    """Cosine similarity of two arrays, flattened."""
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b) + 1e-30))
