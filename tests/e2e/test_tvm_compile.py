"""Every converted model the e2e suite validates also compiles for TVM llvm at a fixed shape, and the
artifact gives the bits of the library and of the function bodies on digits test images.

#29: an onnxruntime ``quantize_static`` ViT expands its class token to a batch computed from ``Shape``
through ``Where``/``Equal``, which relax cannot follow; the TVM engine now folds such values at the build's
input shapes (``engines/tvm/static_shapes.py``). A one-block torch export in that recipe is the fast case."""

from __future__ import annotations

import numpy as np
import pytest

from ivit_onnx import rewrite
from ivit_onnx.qparams import KERNELS
from ivit_onnx.runners import graph_inputs, make_runner

pytest.importorskip("tvm")
pytestmark = pytest.mark.tvm

BATCH = 8


def _compiles_bit_exact(model, digits) -> None:
    from ivit_onnx.engines.tvm import compile_model

    x = digits[2][:BATCH]
    name = graph_inputs(model)[0].name
    got = compile_model(model, target="llvm", shape={name: list(x.shape)}).run({name: x})
    for backend in ("library", "functions"):
        want = make_runner(backend, model).run({name: x})
        for out, value in zip(model.graph.output, got, strict=True):
            np.testing.assert_array_equal(value, want[out.name], err_msg=f"{out.name}: TVM vs {backend}")


def _ort_int(fp32_path, digits, tmp_path, variant):
    from ivit_onnx.models.ort_qdq import ort_quantize

    path = tmp_path / f"ort_{variant}.onnx"
    calib = [digits[0][i : i + 128] for i in range(0, 512, 128)]
    ort_quantize(fp32_path, path, calib, variant=variant)
    return rewrite(str(path))[0]


def test_onnxruntime_quantized_torch_export_compiles(digits, tmp_path):
    """The issue's case, one block: a torch export (batch symbolic, the class token expanded through
    ``Where(Equal(shape, -1), 1, shape)``) quantized by ``quantize_static`` int8 symmetric per-channel."""
    from ivit_onnx.models.export import export_onnx
    from ivit_onnx.models.vit import vit
    from tests.e2e.conftest import torch

    torch.manual_seed(0)
    model = vit(8, 2, 1, 10, embed_dim=48, depth=1, num_heads=3).eval()
    export_onnx(model, torch.from_numpy(digits[2][:2]), tmp_path / "fp32.onnx")
    _compiles_bit_exact(_ort_int(tmp_path / "fp32.onnx", digits, tmp_path, "int8_sym"), digits)


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["int8_sym", "uint8_asym", "partial"])
def test_onnxruntime_quantize_static_compiles(variant, digits, digits_fp32_path, tmp_path):
    _compiles_bit_exact(_ort_int(digits_fp32_path, digits, tmp_path, variant), digits)


@pytest.mark.slow
def test_own_fake_quant_models_compile(own_fq, digits):
    _compiles_bit_exact(rewrite(str(own_fq[1]))[0], digits)


@pytest.mark.slow
@pytest.mark.parametrize("kernel", [(k, v) for k, vs in sorted(KERNELS.items()) for v in vs])
def test_bundled_model_compiles_with_every_kernel(kernel, digits):
    from ivit_onnx.models.bundled import default_model_path

    _compiles_bit_exact(rewrite(str(default_model_path()), **dict([kernel]))[0], digits)
