"""The torch integer kernels (``models/int_ops.py``) equal the numpy reference kernels bit for bit, dtype too.

Same hypothesis generators as the opset's own property tests (``tests/opset/test_bitexact.py``), plus its
long-row and extreme-value cases; and the straight-through estimator's value and gradient.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given

from ivit_onnx.opset import OPS
from tests.opset import oneop
from tests.opset.test_bitexact import CASES, LONG_ROWS, PROPERTY, long_row_input, max_abs_minus

torch = pytest.importorskip("torch")
int_ops = pytest.importorskip("ivit_onnx.models.int_ops")


def torch_equals_reference(op: str, inputs, attrs) -> None:
    ref = OPS[op].run(*inputs, **attrs)
    got = int_ops.KERNELS[op](*(torch.from_numpy(np.asarray(x)) for x in inputs), **attrs)
    assert str(got.dtype).removeprefix("torch.") == ref.dtype.name, f"{op}: dtype {got.dtype} != {ref.dtype}"
    assert tuple(got.shape) == ref.shape, f"{op}: shape {tuple(got.shape)} != {ref.shape}"
    diff = np.argwhere(got.numpy() != ref)
    assert not len(diff), f"{op}: {len(diff)} of {ref.size} differ, first at {tuple(diff[0])}"


def test_every_op_has_a_torch_kernel():
    assert set(int_ops.KERNELS) == set(OPS) == set(CASES)


@pytest.mark.parametrize("op", sorted(CASES))
def test_torch_kernel_bit_exact(op):
    @PROPERTY
    @given(case=CASES[op])
    def prop(case):
        torch_equals_reference(op, *case)

    prop()


@pytest.mark.parametrize("row", LONG_ROWS)
@pytest.mark.parametrize("dtype,s_x", [(np.int8, 0.08), (np.int32, 1e-4), (np.int16, 1e-3)])
@pytest.mark.parametrize("kind", ["constant_rows", "uniform", "spike"])
def test_long_rows(row, dtype, s_x, kind):
    """The softmaxes, ShiftGELU and ILayerNorm on rows of 1..4096 at the overflow edges of their sums."""
    x = long_row_input(row, dtype, kind)
    torch_equals_reference("Shiftmax", [x, np.int8(0)], oneop.shiftmax_params(s_x, row, 7))
    poly = oneop.poly_softmax_params(s_x, row, 7)
    torch_equals_reference("IBertSoftmax", [x, np.int8(0)], poly)
    torch_equals_reference("LogIntSoftmax", [x, np.int8(0)], {**poly, "log_bits": 4})
    lo, hi = oneop.info(dtype)
    max_abs = max(-lo, hi)
    attrs, b, c = oneop.shiftgelu_params(
        s_x, s_x * max_abs / 127, max_abs, min(23, 54 - max_abs.bit_length()), -128, 127
    )
    torch_equals_reference("ShiftGELU", [x, b, c, np.int8(0)], attrs)
    if dtype == np.int32:
        lo, hi = -(2**20), 2**20 - 1
        x = long_row_input(row, dtype, kind, lo=lo, hi=hi)
    rng = np.random.default_rng(row)
    gamma = rng.choice([-1, 1], row) * np.exp(rng.uniform(np.log(1e-2), np.log(4), row))
    attrs, b, c, bias = oneop.ilayernorm_params(gamma, rng.normal(0, 1, row), 0.05, hi - lo, -32768, 32767)
    torch_equals_reference("ILayerNorm", [x, b, c, bias, np.int16(0)], attrs)


@pytest.mark.parametrize("xt", oneop.INT_DTYPES)
def test_rescale_extremes(xt):
    """Requantize and IAdd at the dtype extremes with the smallest and largest scale ratios."""
    lo, hi = oneop.info(xt)
    x = np.array([lo, lo + 1, -1 if lo < 0 else 1, 0, 1, hi - 1, hi], dtype=xt)
    for s_x, s_y in [(1e-4, 1.0), (1.0, 1e-4), (3e-3, 7e-3)]:
        b, c = oneop.requantize_params(s_x, s_y, max_abs_minus(xt, 0 if lo < 0 else lo))
        torch_equals_reference(
            "Requantize", [x, xt(0 if lo < 0 else lo), b, c, np.int8(0)], {"qmin": -128, "qmax": 127}
        )
    y = np.full(x.shape, -32768, np.int16)
    ma, mb, c = oneop.iadd_params(1e-4, 1.0, 1e-4, max_abs_minus(xt, hi), 65535)
    torch_equals_reference(
        "IAdd", [x, y, xt(hi), np.int16(32767), ma, mb, c, np.int32(0)], {"qmin": -(2**31), "qmax": 2**31 - 1}
    )


def test_ste_value_exact_gradient_of_float_function():
    x = torch.linspace(-3, 3, 7, dtype=torch.float32, requires_grad=True)
    approx = torch.nn.functional.gelu(x)
    exact = torch.round(approx * 8) / 8
    y = int_ops.ste(exact, approx)
    assert torch.equal(y, exact)
    (g,) = torch.autograd.grad(y.sum(), x)
    (g_ref,) = torch.autograd.grad(torch.nn.functional.gelu(x).sum(), x)
    assert torch.equal(g, g_ref)
