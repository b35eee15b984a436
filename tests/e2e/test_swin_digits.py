"""A Swin trained on scikit-learn's digits (~25 s, one thread, fixed seeds): its integer graph follows the
fake-quant model on the 450 held-out images by the house bounds, which hold on every CPU although the weights
trained differ with the CPU (``models/hf_matrix.py``: cosine and top-1 agreement on the inputs with a margin,
an accuracy loss within chance; docs/testing.md)."""

from __future__ import annotations

import numpy as np
import pytest

from ivit_onnx import rewrite
from ivit_onnx.certify import float_offenders
from ivit_onnx.runners import make_runner

torch = pytest.importorskip("torch")
pytest.importorskip("sklearn")

from ivit_onnx.models import hf_matrix as hm  # noqa: E402
from ivit_onnx.models.digits_swin import train_digits_swin  # noqa: E402
from ivit_onnx.models.export import export_onnx  # noqa: E402
from ivit_onnx.models.quant import quantize  # noqa: E402


def _logits(backend: str, model, x: np.ndarray) -> np.ndarray:
    return make_runner(backend, model, threads=1).run({"input": x})["logits"]


def test_digits_swin_integer_accuracy(digits, tmp_path):
    import onnx

    x_train, y_train, x_test, y_test = digits
    model = train_digits_swin(x_train, y_train)
    calib = [torch.from_numpy(x_train[i : i + 256]) for i in range(0, len(x_train), 256)]
    fq_path = tmp_path / "digits_swin_fq.onnx"
    export_onnx(quantize(model, calib), torch.from_numpy(x_test[:2]), fq_path)
    int_model, report = rewrite(str(fq_path))
    assert float_offenders(int_model) == [] and report.notes["float_islands"] == []
    fq = _logits("onnxruntime", onnx.load(fq_path), x_test)
    got = _logits("library", int_model, x_test)
    np.testing.assert_array_equal(_logits("functions", int_model, x_test[:16]), got[:16])
    result = hm.compare(fq, got, y_test)
    print(f"SWIN_DIGITS {result}")
    assert result["fq_accuracy"] >= hm.LEARNED * 100, result  # it learned (chance is 10 %)
    assert hm.failed_bounds(result) == [], result
