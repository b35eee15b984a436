"""IL2Norm: close to ``x / max(||x||, eps)`` within a stated bound, with the converter's parameters
(``qparams.l2norm``); and bit-exact across the reference, both function-body engines, the native kernels, the
custom-op library and the torch twin on long rows, extremes and all-zero rows (the hypothesis cases of every
way are ``tests/opset/test_bitexact.py::il2norm_cases``).

The bound, per element, in real units (``y * s_y`` against ``f = x / max(||x||, eps)`` clipped to the output
range): ``s_y / 2`` (the final rounding) ``+ 1 / r`` (the floor of the integer square root, or ``eps``'s
rounding up to the grid of ``d``: ``r`` the row's integer norm) ``+ 2**(1-p)`` (the two floors of ``u``)
``+ |b 2**(p-c) s_y - 1|`` (the dyadic multiplier's relative error, ``|u| <= 2**p``).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from onnx import TensorProto

from ivit_onnx import qparams
from ivit_onnx.affine import Affine
from ivit_onnx.opset import OPS
from ivit_onnx.opset.ilayernorm import isqrt
from tests.opset.oneop import OPSETS, check_all_ways, info
from tests.opset.test_bitexact import KINDS, PROPERTY, log_uniform, make_tensor

SPEC = OPS["IL2Norm"]
P = 30  # the converter's ln_fraction_bits


def converted(x: np.ndarray, zx: int, s_x: float, eps: float, target: Affine | None):
    """``(inputs, attrs, params)`` of the IL2Norm the converter writes for ``x`` of type ``(s_x, zx)``."""
    a = Affine(np.float64(s_x), zx, x.dtype)
    lp = qparams.l2norm(a, x.shape[-1], eps, target, P)
    assert lp.pre is None  # 8- and 16-bit inputs need no narrowing
    lo, hi = lp.t.qrange
    zy = np.array(lp.t.zero_point, lp.t.dtype)
    inputs = [x, np.array(zx, x.dtype), lp.multiplier, lp.shift, zy]
    return inputs, {"shift_in": lp.shift_in, "eps": lp.eps, "p": lp.p, "qmin": lo, "qmax": hi}, lp


def check_bound(x: np.ndarray, zx: int, s_x: float, eps: float, target: Affine | None) -> np.ndarray:
    inputs, attrs, lp = converted(x, zx, s_x, eps, target)
    y = SPEC.run(*inputs, **attrs)
    s_y, zy = float(lp.t.scale), lp.t.zero_point
    xr = (x.astype(np.float64) - zx) * s_x
    den = np.broadcast_to(np.maximum(np.linalg.norm(xr, axis=-1, keepdims=True), eps), xr.shape)
    f = np.divide(xr, den, out=np.zeros_like(xr), where=den > 0)  # a zero row: 0 (eps = 0: LpNormalization's)
    f = np.clip(f, (attrs["qmin"] - zy) * s_y, (attrs["qmax"] - zy) * s_y)
    d = (x.astype(np.int64) - zx) << attrs["shift_in"]
    r = np.maximum(isqrt(np.maximum(np.sum(d * d, axis=-1, keepdims=True), 1)), attrs["eps"])
    mult_err = abs(float(lp.multiplier) * 2.0 ** (P - float(lp.shift)) * s_y - 1)
    bound = s_y / 2 + 1 / r + 2.0 ** (1 - P) + mult_err + 1e-12
    err = np.abs((y.astype(np.float64) - zy) * s_y - f)
    assert np.all(err <= bound), f"max excess {np.max(err - bound):.3g} (error {np.max(err):.3g})"
    return y


# ---------------------------------------------------------------------------------- against float


@st.composite
def approx_cases(draw):
    xt = draw(st.sampled_from([np.int8, np.uint8, np.int16]))
    row = draw(st.sampled_from([1, 2, 3, 7, 64, 197, 768, 4096]))
    lead = draw(st.integers(1, 3))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    lo, hi = info(xt)
    x = make_tensor(rng, (lead, row), xt, draw(st.sampled_from(KINDS)))
    zx = draw(st.sampled_from([0 if lo <= 0 else lo, (lo + hi + 1) // 2, draw(st.integers(lo, hi))]))
    x[0] = zx if draw(st.booleans()) else x[0]  # an all-zero row
    s_x = log_uniform(draw, 1e-4, 1)
    eps = draw(st.sampled_from([1e-12, 0.0, s_x, 3 * s_x * math.sqrt(row)]))
    target = draw(st.sampled_from([None, Affine(np.float64(1 / 128), 0, np.int8),
                                   Affine(np.float64(1 / 255), 128, np.uint8),
                                   Affine(np.float64(2.0**-15), 0, np.int16)]))
    return x, zx, s_x, eps, target


@PROPERTY
@given(case=approx_cases())
def test_close_to_float_l2_normalization(case):
    check_bound(*case)


@pytest.mark.parametrize("xt", [np.int8, np.int16])
def test_extreme_rows_at_4096_and_1(xt):
    lo, hi = info(xt)
    for row in (1, 4096):
        x = np.stack([np.full(row, lo), np.full(row, hi), np.where(np.arange(row) % 2, lo, hi),
                      np.zeros(row, np.int64)]).astype(xt)
        y = check_bound(x, 0, 0.02, 1e-12, Affine(np.float64(2.0**-15), 0, np.int16))
        assert np.all(y[3] == 0)  # the all-zero row
        if row == 1:  # a row of one element is its sign
            assert list(y[:3, 0]) == [-32768, 32767, 32767]


def test_a_row_below_eps_is_divided_by_eps():
    """``x / max(||x||, eps)`` for a row whose norm lies below ``eps``: ``x / eps``, not ``x / ||x||``."""
    x = np.array([[3, -4, 0, 0], [30, -40, 0, 0]], np.int8)
    s_x, eps = 0.01, 0.1  # norms 0.05 and 0.5
    y = check_bound(x, 0, s_x, eps, Affine(np.float64(2.0**-15), 0, np.int16))
    np.testing.assert_allclose(y[0, :2] * 2.0**-15, [0.3, -0.4], atol=2.0**-14)
    np.testing.assert_allclose(y[1, :2] * 2.0**-15, [0.6, -0.8], atol=2.0**-14)


# ------------------------------------------------------------------------- bit-exact, every way


def torch_twin(inputs, attrs) -> np.ndarray:
    torch = pytest.importorskip("torch")
    from ivit_onnx.models import int_ops

    return int_ops.il2norm(*(torch.from_numpy(np.asarray(v)) for v in inputs), **attrs).numpy()


@pytest.mark.parametrize("row", [1, 2, 197, 4096])
@pytest.mark.parametrize("xt,zx,bound", [(np.int8, 0, None), (np.uint8, 128, None), (np.int16, -7, None),
                                         (np.int32, 0, 2**20)])
@pytest.mark.parametrize("kind", ["extreme", "uniform", "constant_rows", "zero_rows"])
def test_long_rows_bit_exact(row, xt, zx, bound, kind):
    lo, hi = info(xt) if bound is None else (-bound, bound - 1)
    rng = np.random.default_rng(row)
    if kind == "zero_rows":
        x = np.full((2, row), zx, xt)
    else:
        x = make_tensor(rng, (2, row), xt, kind, lo, hi)
    a = Affine(np.float64(0.01), zx, xt, bound=max(hi - zx, zx - lo))
    lp = qparams.l2norm(a, row, 1e-12, None, P)
    assert lp.pre is None
    attrs = {"shift_in": lp.shift_in, "eps": lp.eps, "p": P, "qmin": -32768, "qmax": 32767}
    # extreme rows put sum(d*d) just below 2**62 at this shift_in
    inputs = [x, np.array(zx, xt), lp.multiplier, lp.shift, np.int16(0)]
    y = check_all_ways(SPEC, inputs, attrs, opset=OPSETS[row % 2])
    np.testing.assert_array_equal(torch_twin(inputs, attrs), y)
    if kind == "zero_rows":
        assert np.all(y == 0)


def test_wide_input_is_narrowed_first():
    """An int32 input whose sum of squares could overflow is requantized down first (``pre``)."""
    a = Affine(np.float64(1e-4), 0, np.int32)
    lp = qparams.l2norm(a, 4096, 1e-12, None, P)
    assert lp.pre is not None and lp.zero_point == 0
    assert 4096 * (lp.pre.bound << lp.shift_in) ** 2 < 2**62


# ------------------------------------------------------------------------------ the custom-op library


def test_broadcast_parameters_take_the_librarys_general_path():
    """Multipliers along a leading axis and a y_zero_point wider than x: outside the fused native call, the
    custom op's row-by-row path (and the function bodies) still equal the reference."""
    rng = np.random.default_rng(5)
    x = rng.integers(-128, 128, (3, 1, 9)).astype(np.int8)
    inputs = [x, np.int8(-3), np.array([[[2**20]], [[2**21]], [[2**19]]], np.int64), np.int64(40),
              np.zeros((3, 2, 9), np.int16)]
    attrs = {"shift_in": 16, "eps": 1, "p": 30, "qmin": -32768, "qmax": 32767}
    check_all_ways(SPEC, inputs, attrs)


@pytest.mark.parametrize(
    "attrs, expected",
    [
        ({"shift_in": 8, "eps": 0, "p": 30}, "attribute eps=0 is outside 1..4611686018427387903"),
        ({"shift_in": 63, "eps": 1, "p": 30}, "attribute shift_in=63 is outside 0..62"),
        ({"shift_in": 8, "eps": 1, "p": 62}, "attribute p=62 is outside 0..61"),
    ],
)
def test_attributes_refused_at_session_creation(attrs, expected):
    from tests.opset.test_native_ort import bare_model, library_session, native_library

    if native_library() is None:
        pytest.skip("native library not built")
    i8, i64 = TensorProto.INT8, TensorProto.INT64
    model = bare_model(
        "IL2Norm",
        [("x", i8, [2, 5]), ("zx", i8, []), ("b", i64, []), ("c", i64, []), ("zy", i8, [])],
        {**attrs, "qmin": -128, "qmax": 127},
        i8,
    )
    with pytest.raises(Exception, match="ai.ivit IL2Norm node 'the_node' refused") as info:
        library_session(model, native_library())
    assert expected in str(info.value)
