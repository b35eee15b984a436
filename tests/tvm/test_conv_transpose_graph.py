"""Converted ConvTranspose graphs (the blockwise MatMulInteger form and the zero-inserted ConvInteger form,
groups and dilations included) through TVM on llvm equal onnxruntime's run of them bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

from ivit_onnx import rewrite
from tests.graphs import run
from tests.passes.test_rule_conv_transpose import CASES, _graph

tvm = pytest.importorskip("tvm")
from ivit_onnx.engines.tvm import compile_model  # noqa: E402

pytestmark = pytest.mark.tvm


@pytest.mark.parametrize(
    "case", ["k2_s2", "k3_s2_p1_op1", "blockwise_3d", "groups", "groups_pads_past_reach_int8", "dilated_1d"]
)
def test_conv_transpose_bit_exact_on_llvm(case):
    fq, feed = _graph(**CASES[case][0])
    out, _ = rewrite(fq)
    np.testing.assert_array_equal(compile_model(out).run(feed)[0], run(out, feed)[0])
