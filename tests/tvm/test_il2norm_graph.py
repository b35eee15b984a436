"""A converted cosine-attention graph (two IL2Norm row kernels feeding q @ k^T) through TVM on llvm equals the
function bodies in onnxruntime bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

from ivit_onnx import rewrite
from tests.graphs import op_counts, run

tvm = pytest.importorskip("tvm")
torch = pytest.importorskip("torch")
from ivit_onnx.engines.tvm import compile_model  # noqa: E402
from tests.passes.test_rule_fuse_l2norm import CosineAttention, exported  # noqa: E402

pytestmark = pytest.mark.tvm


def test_cosine_attention_bit_exact_on_llvm():
    x = np.random.default_rng(11).standard_normal((2, 6, 32)).astype(np.float32)
    x[0, 0, :16] = 0.0  # an all-zero row of q
    out, _ = rewrite(exported(CosineAttention(), torch.from_numpy(x), "torchscript"))
    assert op_counts(out).get("ai.ivit:IL2Norm") == 2
    got = compile_model(out, shape={"input": list(x.shape)}).run([x])
    np.testing.assert_array_equal(got[0], run(out, {"input": x})[0])
