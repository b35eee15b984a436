"""The TVM kernels of the Softmax ablation ops (``kernels.poly_softmax``) in the attention pattern of
:mod:`test_consumer_fusion` with the Shiftmax swapped for them: one row kernel each, also writing the row sums
its uint8 P·V GEMM's zero-point term needs, bit-exact against the numpy references on llvm; on cuda (nvcc's
PTX, no GPU needed) one kernel per op whose only 64-bit divisions are per row, outside the element loops."""

from __future__ import annotations

import re
import shutil

import numpy as np
import pytest

from ivit_onnx import qparams
from ivit_onnx.opset import OPS
from ivit_onnx.opset.functions import attach_functions
from ivit_onnx.opset.reference import evaluator

tvm = pytest.importorskip("tvm")
from test_consumer_fusion import SHAPE, _feeds, _fused_names, attention_model  # noqa: E402
from test_fused_ops import _division_loops, div64_per_kernel  # noqa: E402

from ivit_onnx.engines.tvm import compile_model  # noqa: E402
from ivit_onnx.engines.tvm.cuda import cuda_sources, to_ptx  # noqa: E402

pytestmark = pytest.mark.tvm
OPS_BY_KERNEL = {"IBertSoftmax": "ivit_ibertsoftmax", "LogIntSoftmax": "ivit_logintsoftmax"}


def attention_with(op: str, probs_output: bool = False):
    """:func:`attention_model` with its Shiftmax replaced by ``op`` on the same scores (``x0`` its grid)."""
    model = attention_model(probs_output)
    (node,) = [n for n in model.graph.node if n.op_type == "Shiftmax"]
    x0 = 1226
    qb, qc = qparams.poly_coefficients(x0)
    attrs = {"x0": x0, "qb": qb, "qc": qc, "n": 30, "bits": 8}
    if op == "LogIntSoftmax":
        attrs["log_bits"] = qparams.LIS_LOG_BITS
    new = OPS[op].make_node(list(node.input), list(node.output), name=op, **attrs)
    nodes = [new if n is node else n for n in model.graph.node]
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return attach_functions(model)


@pytest.mark.parametrize("probs_output", [False, True])
@pytest.mark.parametrize("op", sorted(OPS_BY_KERNEL))
def test_attention_bitexact_on_llvm(op, probs_output):
    model = attention_with(op, probs_output)
    names = _fused_names(model)
    assert any(OPS_BY_KERNEL[op] in n for n in names), names
    assert not any("cast_subtract" in n for n in names), names  # P·V takes the kernel's row sums
    art = compile_model(model)
    for feeds in (_feeds(0), {n: np.full(SHAPE, 127, np.int8) for n in ("q", "k", "v")}):
        for out, ref in zip(art.run(feeds), evaluator(model).run(None, feeds), strict=True):
            assert out.dtype == ref.dtype
            np.testing.assert_array_equal(out, ref)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
@pytest.mark.parametrize("op", sorted(OPS_BY_KERNEL))
def test_cuda_one_kernel_divisions_per_row(op):
    art = compile_model(attention_with(op), target="cuda", arch="sm_90")
    (source,) = cuda_sources(art.module)
    names = set(re.findall(r'extern "C" __global__ void (?:__launch_bounds__\(\d+\) )?(\w+)\(', source))
    (kernel,) = [n for n in names if OPS_BY_KERNEL[op] in n]
    div = div64_per_kernel(to_ptx(source, "sm_90"))
    # IBertSoftmax: the row's reciprocal; LogIntSoftmax: its thresholds divide by constants (multiplies)
    assert div.pop(kernel) == (1 if op == "IBertSoftmax" else 0), div
    assert not any(div.values()), div
    if op == "IBertSoftmax":
        assert _division_loops(source, kernel) == [], "division inside a loop over elements"


@pytest.mark.parametrize("softmax", sorted(qparams.POLY_SOFTMAX))
def test_digits_model_bitexact(softmax):
    """The bundled digits ViT rewritten with ``--softmax ibert|lis``, through the kernels, equals the
    function bodies in onnxruntime on real digits."""
    import onnxruntime as ort

    from ivit_onnx import rewrite
    from ivit_onnx.models.bundled import default_model_path

    pytest.importorskip("sklearn")
    from sklearn.datasets import load_digits

    model, _ = rewrite(default_model_path(), softmax=softmax)
    name = model.graph.input[0].name
    shape = [8] + [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim[1:]]
    x = (load_digits().images[:8, None] / 16.0).astype(np.float32).reshape(shape)
    (out,) = compile_model(model, shape={name: shape}).run({name: x})
    bodies = ort.InferenceSession(
        attach_functions(model).SerializeToString(), providers=["CPUExecutionProvider"]
    )
    np.testing.assert_array_equal(out, bodies.run(None, {name: x})[0])


@pytest.mark.parametrize("op", sorted(OPS_BY_KERNEL))
def test_inlined_bodies_bitexact_on_llvm(op):
    """``compile_model(kernels=False)``: the function bodies, inlined, through TVM's own ONNX converters."""
    from _tvm_cases import GENERATORS, batch_feeds, batch_model

    rng = np.random.default_rng(1)
    cases = [GENERATORS[op](rng, shape) for shape in [(3,), (2, 7), (2, 3, 16), (1, 2, 197)]]
    outs = compile_model(batch_model(op, cases), kernels=False).run(batch_feeds(cases))
    for (inputs, attrs), out in zip(cases, outs, strict=True):
        np.testing.assert_array_equal(out, OPS[op].run(*inputs, **attrs), err_msg=f"{op} {attrs}")
