"""Every implementation of every private op equals the numpy reference kernel, bit for bit, dtype too.

The four ways (see :mod:`tests.opset.oneop`): reference kernel, function body in onnxruntime, function body in
``onnx.reference``, custom-op library; plus the reference-bound ``onnx.reference`` evaluator. Inputs
come from hypothesis (shapes of rank 1-4, int8/uint8/int16/int32, scales 1e-4..1 folded the way a
converter folds them, zero points, extreme values, constant rows, per-channel multipliers, opset 17
and 18, parameters as initializers or graph inputs); rows up to 4096 are covered separately.
"""

from __future__ import annotations

import math
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ivit_onnx.opset import OPS
from ivit_onnx.opset.shift_exp import max_n
from tests.opset.oneop import (
    INT_DTYPES,
    OPSETS,
    check_all_ways,
    iadd_params,
    ibertgelu_params,
    il2norm_params,
    ilayernorm_params,
    info,
    l1_shift_in,
    poly_softmax_params,
    requantize_params,
    shiftgelu_params,
    shiftmax_params,
)

#: examples per op; IVIT_OPSET_EXAMPLES=2000 for a long run
EXAMPLES = int(os.environ.get("IVIT_OPSET_EXAMPLES", "120"))
PROPERTY = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])

KINDS = ("uniform", "normal", "extreme", "constant_rows", "narrow", "spike")

# ------------------------------------------------------------------------------------------ tensors


def make_tensor(rng: np.random.Generator, shape, dtype, kind: str, lo: int | None = None,
                hi: int | None = None) -> np.ndarray:
    """An integer tensor in ``[lo, hi]`` (default: the dtype's range) with the distribution ``kind``."""
    dlo, dhi = info(dtype)
    lo = dlo if lo is None else lo
    hi = dhi if hi is None else hi
    shape = tuple(shape)
    if kind == "uniform":
        x = rng.integers(lo, hi, shape, endpoint=True, dtype=np.int64)
    elif kind == "normal":
        center = rng.integers(lo, hi, endpoint=True)
        std = np.exp(rng.uniform(0, np.log(max(2.0, (hi - lo) / 4))))
        x = np.clip(np.round(rng.normal(center, std, shape)), lo, hi).astype(np.int64)
    elif kind == "extreme":
        x = rng.choice(np.array([lo, hi, lo + 1, hi - 1, min(max(0, lo), hi)], np.int64), shape)
    elif kind == "constant_rows":
        x = np.broadcast_to(rng.integers(lo, hi, shape[:-1] + (1,), endpoint=True, dtype=np.int64), shape)
    elif kind == "narrow":
        center = rng.integers(lo, hi, endpoint=True)
        x = np.clip(center + rng.integers(-3, 3, shape, endpoint=True), lo, hi)
    elif kind == "spike":  # small values and one maximal element per row
        x = rng.integers(lo, min(hi, lo + 16), shape, endpoint=True, dtype=np.int64)
        idx = rng.integers(0, shape[-1], shape[:-1] + (1,))
        np.put_along_axis(x, idx, hi, axis=-1)
    else:
        raise ValueError(kind)
    return np.ascontiguousarray(x).astype(dtype)


def log_uniform(draw, lo: float, hi: float) -> float:
    return float(np.exp(draw(st.floats(np.log(lo), np.log(hi)))))


shapes = st.lists(st.integers(1, 4), min_size=0, max_size=3).flatmap(
    lambda lead: st.integers(1, 64).map(lambda row: tuple(lead) + (row,)))
dtypes = st.sampled_from(INT_DTYPES)
kinds = st.sampled_from(KINDS)
seeds = st.integers(0, 2**32 - 1)
ways = st.tuples(st.sampled_from(OPSETS), st.booleans())  # (opset, parameters as graph inputs)


def pick(draw, fixed):
    """A dtype: ``fixed`` when given (``tests.opset.test_native_ort`` walks every pair), else drawn."""
    return fixed if fixed is not None else draw(dtypes)


def zero_point(draw, dtype, wide: bool = True) -> int:
    lo, hi = info(dtype)
    if dtype == np.int32 and not wide:
        lo, hi = -1000, 1000
    return draw(st.one_of(st.just(0) if lo <= 0 else st.just(lo), st.integers(lo, hi)))


def out_range(draw, dtype) -> tuple[int, int]:
    """``(qmin, qmax)``: the dtype's range, a symmetric or ReLU-like sub-range, or a random one."""
    lo, hi = info(dtype)
    a, b = sorted((draw(st.integers(lo, hi)), draw(st.integers(lo, hi))))
    return draw(st.sampled_from([(lo, hi), (max(lo, -hi), hi), (max(lo, 0), hi), (a, b)]))


def max_abs_minus(dtype, z: int) -> int:
    lo, hi = info(dtype)
    return max(abs(lo - z), abs(hi - z))


# ------------------------------------------------------------------------------------------ cases


@st.composite
def requantize_cases(draw, xt=None, yt=None):
    shape, xt, kind, rng = draw(shapes), pick(draw, xt), draw(kinds), np.random.default_rng(draw(seeds))
    yt = pick(draw, yt)
    x = make_tensor(rng, shape, xt, kind)
    zx = zero_point(draw, xt, wide=False)
    bound = max_abs_minus(xt, zx)
    s_x, s_y = log_uniform(draw, 1e-4, 1), log_uniform(draw, 1e-4, 1)
    per_channel = draw(st.booleans())
    if per_channel:
        axis = draw(st.integers(0, len(shape) - 1))
        ch = s_x * np.exp(rng.uniform(np.log(0.05), np.log(20), shape[axis]))
        b, c = requantize_params(s_x, s_y, bound, ch)
        b = b.reshape((-1,) + (1,) * (len(shape) - 1 - axis))
        c = c.reshape(b.shape)
    else:
        b, c = requantize_params(s_x, s_y, bound)
    qmin, qmax = out_range(draw, yt)
    zy = draw(st.integers(qmin, qmax))
    inputs = [x, xt(zx), b, c, yt(zy)]
    return inputs, {"qmin": qmin, "qmax": qmax}


@st.composite
def iadd_cases(draw, at=None, bt=None, yt=None):
    out_shape, rng = draw(shapes), np.random.default_rng(draw(seeds))
    at, bt, yt = pick(draw, at), pick(draw, bt), pick(draw, yt)
    # b broadcasts against a (or the other way round): drop leading dims, set some dims to 1
    small = list(out_shape[draw(st.integers(0, len(out_shape) - 1)):])
    for i in range(len(small)):
        if draw(st.booleans()):
            small[i] = 1
    a_shape, b_shape = (out_shape, tuple(small)) if draw(st.booleans()) else (tuple(small), out_shape)
    a = make_tensor(rng, a_shape, at, draw(kinds))
    b = make_tensor(rng, b_shape, bt, draw(kinds))
    za, zb = zero_point(draw, at, wide=False), zero_point(draw, bt, wide=False)
    s_a, s_b, s_y = (log_uniform(draw, 1e-4, 1) for _ in range(3))
    if draw(st.booleans()):  # per-channel scales on the last axis
        ch = np.exp(rng.uniform(np.log(0.1), np.log(10), out_shape[-1]))
        s_a = s_a * ch
    ma, mb, c = iadd_params(s_a, s_b, s_y, max_abs_minus(at, za), max_abs_minus(bt, zb))
    qmin, qmax = out_range(draw, yt)
    zy = draw(st.integers(qmin, qmax))
    inputs = [a, b, at(za), bt(zb), ma, mb, c, yt(zy)]
    return inputs, {"qmin": qmin, "qmax": qmax}


# (output dtype, fraction bits) of the Shiftmax output, zero point drawn so zy + 2**bits - 1 fits
SHIFTMAX_OUT = [(np.int8, 7), (np.int8, 8), (np.uint8, 8), (np.uint8, 5), (np.int16, 15), (np.int16, 10),
                (np.int32, 30), (np.int32, 16)]


@st.composite
def shiftmax_cases(draw, xt=None, yt=None):
    shape, xt, kind, rng = draw(shapes), pick(draw, xt), draw(kinds), np.random.default_rng(draw(seeds))
    x = make_tensor(rng, shape, xt, kind)
    yt, bits = draw(st.sampled_from([o for o in SHIFTMAX_OUT if yt in (None, o[0])]))
    lo, hi = info(yt)
    zy = draw(st.sampled_from([lo, max(lo, 0), hi - 2**bits + 1]))
    attrs = shiftmax_params(log_uniform(draw, 1e-4, 1), shape[-1], bits)
    attrs["n"] = draw(st.sampled_from([attrs["n"], min(attrs["n"], 15), 0]))
    return [x, yt(zy)], attrs


@st.composite
def shiftgelu_cases(draw, xt=None, yt=None):
    shape, xt, kind, rng = draw(shapes), pick(draw, xt), draw(kinds), np.random.default_rng(draw(seeds))
    x = make_tensor(rng, shape, xt, kind)
    yt = pick(draw, yt)
    lo, hi = info(xt)
    max_abs = max(abs(lo), abs(hi))
    bits = draw(st.integers(1, min(30, 54 - max_abs.bit_length())))
    qmin, qmax = out_range(draw, yt)
    zy = draw(st.integers(qmin, qmax))
    s_x, s_y = log_uniform(draw, 1e-4, 1), log_uniform(draw, 1e-4, 1)
    per_channel = np.exp(rng.uniform(np.log(0.1), np.log(10), shape[-1])) if draw(st.booleans()) else None
    attrs, b, c = shiftgelu_params(s_x, s_y, max_abs, bits, qmin, qmax, per_channel)
    attrs["n"] = draw(st.sampled_from([attrs["n"], min(attrs["n"], 23), 0]))
    return [x, b, c, yt(zy)], attrs


@st.composite
def ilayernorm_cases(draw, xt=None, yt=None, unit=None):
    shape, xt, kind, rng = draw(shapes), pick(draw, xt), draw(kinds), np.random.default_rng(draw(seeds))
    c_len = shape[-1]
    lo, hi = info(xt)
    if xt == np.int32:  # keep C * (hi - lo)**2 < 2**62: the converter knows the accumulator's range
        k = draw(st.integers(4, 23))
        lo, hi = -(2**k), 2**k - 1
    x = make_tensor(rng, shape, xt, kind, lo, hi)
    yt = pick(draw, yt)
    qmin, qmax = out_range(draw, yt)
    zy = draw(st.integers(qmin, qmax))
    gamma = rng.choice([-1, 1], c_len) * np.exp(rng.uniform(np.log(1e-2), np.log(4), c_len))
    beta = rng.normal(0, draw(st.sampled_from([0.0, 0.1, 1.0])), c_len)
    s_y = log_uniform(draw, 1e-3, 1)
    p = draw(st.sampled_from([30, 30, 0, 16, 45]))
    attrs, b, c, bias = ilayernorm_params(gamma, beta, s_y, hi - lo, qmin, qmax, p, unit and unit(c_len))
    attrs["shift_in"] = draw(st.sampled_from([attrs["shift_in"], 0]))
    return [x, b, c, bias, yt(zy)], attrs


# the ablation's kernels (paper Table 2)


@st.composite
def ibertgelu_cases(draw, xt=None, yt=None):
    shape, xt, kind, rng = draw(shapes), pick(draw, xt), draw(kinds), np.random.default_rng(draw(seeds))
    x = make_tensor(rng, shape, xt, kind)
    yt = pick(draw, yt)
    lo, hi = info(xt)
    max_abs = max(abs(lo), abs(hi))
    bits = draw(st.integers(1, min(30, 52 - max_abs.bit_length())))  # k from 0 (coarse grids) up
    qmin, qmax = out_range(draw, yt)
    zy = draw(st.integers(qmin, qmax))
    s_x, s_y = log_uniform(draw, 1e-4, 1), log_uniform(draw, 1e-4, 1)
    per_channel = np.exp(rng.uniform(np.log(0.1), np.log(10), shape[-1])) if draw(st.booleans()) else None
    attrs, b, c = ibertgelu_params(s_x, s_y, max_abs, bits, qmin, qmax, per_channel)
    return [x, b, c, yt(zy)], attrs


@st.composite
def l1layernorm_cases(draw, xt=None, yt=None):
    (x, b, c, bias, zy), attrs = draw(ilayernorm_cases(xt, yt, unit=lambda n: n / math.sqrt(math.pi / 2)))
    # beyond ILayerNorm's variance bound: L1LayerNorm only needs C * max|x| * 2**shift_in < 2**61
    wide = l1_shift_in(x.shape[-1], int(np.abs(x.astype(np.int64)).max()))
    attrs["shift_in"] = draw(st.sampled_from([attrs["shift_in"], wide]))
    return [x, b, c, bias, zy], attrs
@st.composite
def il2norm_cases(draw, xt=None, yt=None):
    """IL2Norm: any input zero point, eps from 1 to above the row's norm, per-tensor or per-channel
    multipliers, ``shift_in`` at the overflow edge or 0."""
    shape, xt, kind, rng = draw(shapes), pick(draw, xt), draw(kinds), np.random.default_rng(draw(seeds))
    lo, hi = info(xt)
    if xt == np.int32:  # keep C * max|x - zx|**2 < 2**62: the converter knows the accumulator's range
        k = draw(st.integers(4, 23))
        lo, hi = -(2**k), 2**k - 1
    x = make_tensor(rng, shape, xt, kind, lo, hi)
    zx = draw(st.one_of(st.just(0) if lo <= 0 else st.just(lo), st.integers(lo, hi)))
    yt = pick(draw, yt)
    qmin, qmax = out_range(draw, yt)
    zy = draw(st.integers(qmin, qmax))
    per_channel = np.exp(rng.uniform(np.log(0.5), np.log(2), shape[-1])) if draw(st.booleans()) else None
    p = draw(st.sampled_from([30, 30, 0, 16, 45]))
    attrs, b, c = il2norm_params(shape[-1], hi - lo, log_uniform(draw, 1e-3, 1), qmin, qmax, p, per_channel)
    attrs["shift_in"] = draw(st.sampled_from([attrs["shift_in"], 0]))
    k = attrs["shift_in"]
    attrs["eps"] = draw(st.sampled_from([1, 1, 2**k, 2 ** (k + 20), 2**62 - 1]))
    return [x, xt(zx), b, c, yt(zy)], attrs


@st.composite
def poly_softmax_cases(draw, op: str, xt=None, yt=None):
    """IBertSoftmax / LogIntSoftmax: Shiftmax's inputs and outputs, I-BERT's exp on the grid ``ln2/s``, ``n``
    at the row's overflow edge or below; LogIntSoftmax with 1..5 level bits (FQ-ViT: 4)."""
    shape, xt, kind, rng = draw(shapes), pick(draw, xt), draw(kinds), np.random.default_rng(draw(seeds))
    x = make_tensor(rng, shape, xt, kind)
    yt, bits = draw(st.sampled_from([o for o in SHIFTMAX_OUT if yt in (None, o[0])]))
    lo, hi = info(yt)
    zy = draw(st.sampled_from([lo, max(lo, 0), hi - 2**bits + 1]))
    log_bits = draw(st.sampled_from([4, 4, 1, 2, 3, 5])) if op == "LogIntSoftmax" else None
    attrs = poly_softmax_params(log_uniform(draw, 1e-4, 1), shape[-1], bits, log_bits)
    attrs["n"] = draw(st.sampled_from([attrs["n"], min(attrs["n"], 15), 0]))
    return [x, yt(zy)], attrs


CASES = {
    "Requantize": requantize_cases(),
    "IAdd": iadd_cases(),
    "Shiftmax": shiftmax_cases(),
    "ShiftGELU": shiftgelu_cases(),
    "ILayerNorm": ilayernorm_cases(),
    "IBertGELU": ibertgelu_cases(),
    "L1LayerNorm": l1layernorm_cases(),
    "IBertSoftmax": poly_softmax_cases("IBertSoftmax"),
    "LogIntSoftmax": poly_softmax_cases("LogIntSoftmax"),
    "IL2Norm": il2norm_cases(),
}


def test_every_op_has_a_property_test():
    assert set(CASES) == set(OPS)


@pytest.mark.parametrize("op", sorted(CASES))
def test_bit_exact(op):
    @PROPERTY
    @given(case=CASES[op], way=ways)
    def prop(case, way):
        inputs, attrs = case
        opset, feed_all = way
        check_all_ways(OPS[op], inputs, attrs, opset, feed_all, evaluator=True)

    prop()


# ------------------------------------------------------------------------------ long rows, extremes

LONG_ROWS = [1, 2, 3, 4, 197, 1024, 4096]


def long_row_input(row: int, dtype, kind: str, seed: int = 0, lo=None, hi=None) -> np.ndarray:
    return make_tensor(np.random.default_rng(seed), (2, row), dtype, kind, lo, hi)


@pytest.mark.parametrize("row", LONG_ROWS)
@pytest.mark.parametrize("dtype,s_x", [(np.int8, 0.08), (np.int32, 1e-4), (np.int16, 1e-3)])
@pytest.mark.parametrize("kind", ["constant_rows", "uniform", "spike"])
def test_shiftmax_long_rows(row, dtype, s_x, kind):
    # constant rows make every exp maximal: the sum reaches row * x0 * 2**n, the overflow edge
    attrs = shiftmax_params(s_x, row, 7)
    assert attrs["n"] == max_n(round(1 / s_x), row)
    x = long_row_input(row, dtype, kind)
    y = check_all_ways(OPS["Shiftmax"], [x, np.int8(0)], attrs, opset=OPSETS[row % 2])
    if kind == "constant_rows":
        assert np.all(np.abs(y.astype(np.int64) - 128 // row) <= 1)


@pytest.mark.parametrize("op", ["IBertSoftmax", "LogIntSoftmax"])
@pytest.mark.parametrize("row", LONG_ROWS)
@pytest.mark.parametrize("dtype,s_x", [(np.int8, 0.08), (np.int32, 1e-4)])
@pytest.mark.parametrize("kind", ["constant_rows", "uniform", "spike"])
def test_poly_softmax_long_rows(op, row, dtype, s_x, kind):
    # constant rows make every exp maximal: the sum reaches row * (qb**2 + qc) * 2**n, the overflow edge
    attrs = poly_softmax_params(s_x, row, 8, 4 if op == "LogIntSoftmax" else None)
    x = long_row_input(row, dtype, kind)
    y = check_all_ways(OPS[op], [x, np.uint8(0)], attrs, opset=OPSETS[row % 2])
    if kind == "constant_rows" and op == "IBertSoftmax":
        assert np.all(np.abs(y.astype(np.int64) - 256 // row) <= 1)


@pytest.mark.parametrize("row", LONG_ROWS)
@pytest.mark.parametrize("dtype,s_x", [(np.int8, 0.05), (np.int32, 1e-4), (np.int16, 2e-3)])
@pytest.mark.parametrize("kind", ["extreme", "uniform"])
def test_shiftgelu_long_rows(row, dtype, s_x, kind):
    lo, hi = info(dtype)
    max_abs = max(-lo, hi)
    bits = min(23, 54 - max_abs.bit_length())
    attrs, b, c = shiftgelu_params(s_x, s_x * max_abs / 127, max_abs, bits, -128, 127)
    x = long_row_input(row, dtype, kind, seed=row)
    check_all_ways(OPS["ShiftGELU"], [x, b, c, np.int8(0)], attrs, opset=OPSETS[row % 2])


@pytest.mark.parametrize("row", LONG_ROWS)
@pytest.mark.parametrize("dtype,bound", [(np.int8, None), (np.int16, None), (np.int32, 2**20)])
@pytest.mark.parametrize("kind", ["extreme", "uniform", "constant_rows"])
def test_ilayernorm_long_rows(row, dtype, bound, kind):
    lo, hi = info(dtype) if bound is None else (-bound, bound - 1)
    rng = np.random.default_rng(row)
    gamma = rng.choice([-1, 1], row) * np.exp(rng.uniform(np.log(1e-2), np.log(4), row))
    beta = rng.normal(0, 1, row)
    attrs, b, c, bias = ilayernorm_params(gamma, beta, 0.05, hi - lo, -32768, 32767)
    # extreme rows put max|x - mean| near hi - lo: with shift_in the variance sum sits just below 2**62
    x = long_row_input(row, dtype, kind, seed=row, lo=lo, hi=hi)
    check_all_ways(OPS["ILayerNorm"], [x, b, c, bias, np.int16(0)], attrs, opset=OPSETS[row % 2])


@pytest.mark.parametrize("xt", INT_DTYPES)
@pytest.mark.parametrize("yt", INT_DTYPES)
def test_requantize_extremes(xt, yt):
    lo, hi = info(xt)
    x = np.array([lo, lo + 1, -1 if lo < 0 else 1, 0, 1, hi - 1, hi], dtype=xt)
    for zx in sorted({lo, 0 if lo < 0 else lo, hi}):
        bound = max_abs_minus(xt, zx)
        for s_x, s_y in [(1e-4, 1.0), (1.0, 1e-4), (0.5, 0.5), (3e-3, 7e-3)]:
            b, c = requantize_params(s_x, s_y, bound)
            ylo, yhi = info(yt)
            check_all_ways(OPS["Requantize"], [x, xt(zx), b, c, yt(0 if ylo < 0 else ylo)],
                           {"qmin": ylo, "qmax": yhi})


@pytest.mark.parametrize("at", INT_DTYPES)
def test_iadd_extremes(at):
    lo, hi = info(at)
    a = np.array([[lo, hi, 0 if lo < 0 else lo, hi]], dtype=at)
    b = np.array([[-32768, 32767, 32767, -32768]], dtype=np.int16)
    ma, mb, c = iadd_params(1e-4, 1.0, 1e-4, max_abs_minus(at, hi), 65535)
    check_all_ways(OPS["IAdd"], [a, b, at(hi), np.int16(-32768), ma, mb, c, np.int32(0)],
                   {"qmin": -(2**31), "qmax": 2**31 - 1})


# ------------------------------------------------------------- the ablation's kernels: long rows, edges


@pytest.mark.parametrize("row", [1, 197, 4096])
@pytest.mark.parametrize("dtype,s_x", [(np.int8, 0.05), (np.int32, 1e-4), (np.int16, 2e-3), (np.int8, 1.0)])
def test_ibertgelu_long_rows(row, dtype, s_x):
    lo, hi = info(dtype)
    max_abs = max(-lo, hi)
    attrs, b, c = ibertgelu_params(s_x, s_x * max_abs / 127, max_abs, 15, -128, 127)
    x = long_row_input(row, dtype, "uniform", seed=row)
    # the erf's clip point and its neighbours, both signs, and the dtype's extremes
    edges = np.array([0, 1, attrs["clip"] - 1, attrs["clip"], attrs["clip"] + 1, hi], np.int64)
    edges = np.clip(np.concatenate([edges, -edges, [lo]]), lo, hi).astype(dtype)
    x.reshape(-1)[: min(x.size, edges.size)] = edges[: x.size]
    check_all_ways(OPS["IBertGELU"], [x, b, c, np.int8(0)], attrs, opset=OPSETS[row % 2])


@pytest.mark.parametrize("row", LONG_ROWS)
@pytest.mark.parametrize("dtype,bound", [(np.int8, None), (np.int16, None), (np.int32, 2**20)])
@pytest.mark.parametrize("kind", ["extreme", "constant_rows"])
def test_l1layernorm_long_rows(row, dtype, bound, kind):
    lo, hi = info(dtype) if bound is None else (-bound, bound - 1)
    rng = np.random.default_rng(row)
    gamma = rng.choice([-1, 1], row) * np.exp(rng.uniform(np.log(1e-2), np.log(4), row))
    attrs, b, c, bias = ilayernorm_params(
        gamma, rng.normal(0, 1, row), 0.05, hi - lo, -32768, 32767, unit=row / math.sqrt(math.pi / 2)
    )
    x = long_row_input(row, dtype, kind, seed=row, lo=lo, hi=hi)
    check_all_ways(OPS["L1LayerNorm"], [x, b, c, bias, np.int16(0)], attrs, opset=OPSETS[row % 2])
    # the widest shift_in the op allows: sum(|d|) just below 2**62
    attrs["shift_in"] = l1_shift_in(row, max(-lo, hi))
    check_all_ways(OPS["L1LayerNorm"], [x, b, c, bias, np.int16(0)], attrs, opset=OPSETS[row % 2])
