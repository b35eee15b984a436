"""How close the integer ops come to float, and to the released I-ViT kernels on the same integers.

The measuring is :mod:`ivit_onnx.opset.approx` (shared with ``benchmarks/bench_ablation.py``): realistic float
tensors quantized to integers once, the float reference computed from those same integers (so only the op's
own approximation is measured), every error absolute in the op's output units and also in LSBs of the output
scale ``s_y``. Our ops are set up as the converter sets them up (their parameters from
:mod:`ivit_onnx.qparams`, as ``passes/rules/nonlinear.py`` emits them: Shiftmax/ShiftGELU inputs upscaled
exactly onto a grid of at least 1/1024, ``n`` from ``max_n``, ShiftGELU with 15 sigmoid bits, ILayerNorm with
``p = 30``). The released kernels (:mod:`tests.opset.released_ivit`) get the same integers and their own
fixed N; their float outputs are quantized to the same ``s_y`` as ours (the QuantAct that follows them), so
both sides are compared at the same output precision. Bounds were set from measurements with some margin.

``python -m tests.opset.test_approx`` (from the repository root) prints the measured table.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from ivit_onnx import qparams
from ivit_onnx.opset.approx import (
    GELU_CASES,
    LONG,
    ROWS,
    SIGMAS,
    Err,
    gaussian_rows,
    gelu,
    gelu_input,
    int8_scores,
    int32_scores,
    layernorm,
    layernorm_input,
    out_scale,
    run_gelu,
    run_layernorm,
    run_softmax,
    softmax,
    softmax_cases,
)
from tests.opset import released_ivit as released
from tests.opset.oneop import info


def no_worse(ours: Err, theirs: Err) -> None:
    assert ours.mean <= theirs.mean, f"mean error {ours} worse than released {theirs}"
    assert ours.max <= theirs.max, f"max error {ours} worse than released {theirs}"


# -------------------------------------------------------------------------------------------- Shiftmax


def shiftmax_errors(x, s):
    want = softmax(x.astype(np.float64) * s)
    ours7 = Err.of(run_softmax("Shiftmax", x, s, np.int8, 7), want, 2.0**-7)
    ours16 = Err.of(run_softmax("Shiftmax", x, s, np.int16, 15), want, 2.0**-15)
    y, scale = released.int_softmax(x, s)
    return ours7, ours16, Err.of(y * scale, want, 2.0**-7)


# |Shiftmax - softmax| with 7 fraction bits (int8 output, scale 2**-7): measured max 2.73 LSB, mean 0.50 LSB
SHIFTMAX_MAX_7 = 3.5 * 2.0**-7
SHIFTMAX_MEAN_7 = 0.6 * 2.0**-7
# with 15 fraction bits the exp approximation dominates: measured max 0.0147, mean 9.3e-5
SHIFTMAX_MAX_15 = 0.018
SHIFTMAX_MEAN_15 = 1.5e-4


@pytest.mark.parametrize("sigma", SIGMAS)
def test_shiftmax_int8_scores(sigma):
    x, s = int8_scores(sigma)
    ours7, ours16, rel = shiftmax_errors(x, s)
    assert ours7.max <= SHIFTMAX_MAX_7 and ours7.mean <= SHIFTMAX_MEAN_7, ours7
    assert ours16.max <= SHIFTMAX_MAX_15 and ours16.mean <= SHIFTMAX_MEAN_15, ours16
    no_worse(ours7, rel)


@pytest.mark.parametrize("row", ROWS)
def test_shiftmax_int32_accumulators(row):
    x, s = int32_scores(row, seed=row, **LONG.get(row, {}))
    ours7, ours16, rel = shiftmax_errors(x, s)
    assert ours7.max <= SHIFTMAX_MAX_7 and ours7.mean <= SHIFTMAX_MEAN_7, ours7
    assert ours16.max <= SHIFTMAX_MAX_15 and ours16.mean <= SHIFTMAX_MEAN_15, ours16
    no_worse(ours7, rel)


# ------------------------------------------------------------------------------------------- ShiftGELU


def shiftgelu_errors(x, s, yt):
    want = gelu(x.astype(np.float64) * s)
    s_y = out_scale(want, yt)
    ours = Err.of(run_gelu("ShiftGELU", x, s, s_y, yt), want, s_y)
    y, scale = released.int_gelu(x, s)
    rel = Err.of(released.quantize(y, scale, s_y, yt).astype(np.float64) * s_y, want, s_y)
    return ours, rel


#: max |x sigmoid(1.702 x) - GELU(x)| over the reals: the approximation ShiftGELU is built on
SIGMOID_GELU_GAP = 0.0204


@pytest.mark.parametrize("xt", [np.int8, np.int16])
@pytest.mark.parametrize("sigma,outliers", GELU_CASES)
def test_shiftgelu_int8_output(sigma, outliers, xt):
    x, s = gelu_input(sigma, outliers, xt)
    ours, rel = shiftgelu_errors(x, s, np.int8)
    # int8 output: measured max 1.12 LSB, mean 0.33 LSB (rounding the exact GELU alone: 0.5 / 0.25)
    assert ours.max <= 1.25 * ours.lsb and ours.mean <= 0.4 * ours.lsb, ours
    no_worse(ours, rel)


@pytest.mark.parametrize("xt", [np.int8, np.int16])
@pytest.mark.parametrize("sigma,outliers", GELU_CASES)
def test_shiftgelu_int16_output(sigma, outliers, xt):
    x, s = gelu_input(sigma, outliers, xt)
    ours, rel = shiftgelu_errors(x, s, np.int16)
    # int16 output: the sigmoid form itself is off by up to 0.0204 (measured max 0.0238, mean 0.0086)
    assert ours.max <= SIGMOID_GELU_GAP + 0.0065, ours
    assert ours.mean <= 0.011, ours
    no_worse(ours, rel)


def test_sigmoid_gelu_gap():
    z = np.linspace(-12, 12, 240001)
    gap = np.abs(z / (1 + np.exp(-1.702 * z)) - gelu(z)).max()
    assert SIGMOID_GELU_GAP - 1e-4 <= gap <= SIGMOID_GELU_GAP


# ------------------------------------------------------------------------------------------ ILayerNorm


def ilayernorm_errors(x, s, gamma, beta, yt):
    want = layernorm(x.astype(np.float64) * s, gamma, beta)
    s_y = out_scale(want, yt)
    ours = Err.of(run_layernorm("ILayerNorm", x, s, gamma, beta, s_y, yt), want, s_y)
    y, scale = released.int_layernorm(x, gamma, beta)
    rel = Err.of(released.quantize(y, scale, s_y, yt).astype(np.float64) * s_y, want, s_y)
    return ours, rel


@pytest.mark.parametrize("yt", [np.int8, np.int16])
@pytest.mark.parametrize("c_len", [192, 768])
@pytest.mark.parametrize("xt", [np.int8, np.int16])
def test_ilayernorm(xt, c_len, yt):
    x, s, gamma, beta = layernorm_input(xt, c_len)
    ours, rel = ilayernorm_errors(x, s, gamma, beta, yt)
    # as good as rounding the float result: measured max 0.53 LSB, mean 0.251 LSB
    assert ours.max <= 0.6 * ours.lsb and ours.mean <= 0.27 * ours.lsb, ours
    no_worse(ours, rel)


# ------------------------------------------------------------------- the ablation's kernels (paper Table 2)


def ibert_gelu_float(z):
    """I-BERT's i-GELU in float: ``z (1 + L(z / sqrt 2)) / 2``,
    ``L(u) = sign(u) (a (min(|u|, -b) + b)**2 + 1)``."""
    a, b = qparams.IBERT_ERF_A, qparams.IBERT_ERF_B
    u = z / math.sqrt(2)
    return z * (1 + np.sign(u) * (a * (np.minimum(np.abs(u), -b) + b) ** 2 + 1)) / 2


#: max |i-GELU(x) - GELU(x)| over the reals: the approximation IBertGELU is built on (at x = 2.35)
IBERT_GELU_GAP = 0.01816


def test_ibert_gelu_gap():
    z = np.linspace(-12, 12, 2400001)
    gap = np.abs(ibert_gelu_float(z) - gelu(z)).max()
    assert IBERT_GELU_GAP - 1e-4 <= gap <= IBERT_GELU_GAP


def ibert_gelu_errors(x, s, yt) -> tuple[Err, Err]:
    """Against the erf GELU, and against the float i-GELU it implements (the integer arithmetic's share)."""
    z = x.astype(np.float64) * s
    want = gelu(z)
    s_y = out_scale(want, yt)
    got = run_gelu("IBertGELU", x, s, s_y, yt)
    return Err.of(got, want, s_y), Err.of(got, ibert_gelu_float(z), s_y)


@pytest.mark.parametrize("xt", [np.int8, np.int16])
@pytest.mark.parametrize("sigma,outliers", GELU_CASES)
def test_ibert_gelu(sigma, outliers, xt):
    x, s = gelu_input(sigma, outliers, xt)
    gelu8, poly8 = ibert_gelu_errors(x, s, np.int8)
    # int8 output: measured max 0.98 LSB, mean 0.33 LSB against GELU; rounding the float i-GELU: 0.50 LSB
    assert gelu8.max <= 1.1 * gelu8.lsb and gelu8.mean <= 0.35 * gelu8.lsb, gelu8
    assert poly8.max <= 0.55 * poly8.lsb, poly8
    gelu16, poly16 = ibert_gelu_errors(x, s, np.int16)
    # int16 output: the polynomial's gap dominates (measured max 0.0188, mean 0.0068); the integer i-GELU is
    # within 1.55 LSB (mean 0.75) of the float one
    assert gelu16.max <= IBERT_GELU_GAP + 0.001 and gelu16.mean <= 0.0075, gelu16
    assert poly16.max <= 2 * poly16.lsb and poly16.mean <= 0.8 * poly16.lsb, poly16


def l1_layernorm_errors(x, s, gamma, beta, yt):
    """``(vs float L1 LayerNorm, vs LayerNorm, within the latter's bound, sigma/(L1_SIGMA mad) range)``.

    ``s_y`` is LayerNorm's (what a model calibrated in float uses). L1 LayerNorm's normalized value is
    LayerNorm's times ``r = sigma / (sqrt(pi/2) mean|x - mean|)`` per row, so
    ``|ours - LN| <= |LN - beta| |r - 1|`` plus our own rounding error: the bound checked, per element.
    """
    xf = x.astype(np.float64) * s
    dev = xf - xf.mean(-1, keepdims=True)
    ln = layernorm(xf, gamma, beta)
    r = xf.std(-1, keepdims=True) / (qparams.L1_SIGMA * np.abs(dev).mean(-1, keepdims=True))
    lo, hi = info(yt)
    s_y = out_scale(ln, yt)
    y = run_layernorm("L1LayerNorm", x, s, gamma, beta, s_y, yt)
    l1 = np.clip((ln - beta) * r + beta, lo * s_y, hi * s_y)  # float L1 LayerNorm, saturated as ours
    bound = np.abs(ln - beta) * np.abs(r - 1) + 0.6 * s_y
    return Err.of(y, l1, s_y), Err.of(y, ln, s_y), np.abs(y - ln) <= bound, (float(r.min()), float(r.max()))


@pytest.mark.parametrize("yt", [np.int8, np.int16])
@pytest.mark.parametrize("c_len", [192, 768])
@pytest.mark.parametrize("xt", [np.int8, np.int16])
@pytest.mark.parametrize("rows", [layernorm_input, gaussian_rows])
def test_l1_layernorm(rows, xt, c_len, yt):
    ours, vs_ln, within, _ = l1_layernorm_errors(*rows(xt, c_len), yt)
    # as good as rounding the float L1 LayerNorm: measured max 0.56 LSB, mean 0.250 LSB
    assert ours.max <= 0.6 * ours.lsb and ours.mean <= 0.26 * ours.lsb, ours
    # against LayerNorm, only the L1 statistic's own mismatch (sigma vs sqrt(pi/2) mean|d|) adds
    assert within.all(), f"{np.sum(~within)} elements beyond |LN - beta| |r - 1| + 0.6 LSB; {vs_ln}"


# ------------------------------------------------------------------------------------------ the table


def table() -> None:  # pragma: no cover - run as a script
    for name, (x, s) in softmax_cases():
        o7, o16, rel = shiftmax_errors(x, s)
        print(f"Shiftmax {name}: ours(7b) {o7} | ours(15b) {o16} | released {rel}")
    for xt in [np.int8, np.int16]:
        for sigma, outl in GELU_CASES:
            for yt in [np.int8, np.int16]:
                o, rel = shiftgelu_errors(*gelu_input(sigma, outl, xt), yt)
                case = f"{xt.__name__}->{yt.__name__} sigma={sigma} outliers x{outl}"
                print(f"ShiftGELU {case}: ours {o} | released {rel}")
    for xt in [np.int8, np.int16]:
        for c_len in [192, 768]:
            for yt in [np.int8, np.int16]:
                o, rel = ilayernorm_errors(*layernorm_input(xt, c_len), yt)
                print(f"ILayerNorm {xt.__name__}->{yt.__name__} C={c_len}: ours {o} | released {rel}")
    for xt in [np.int8, np.int16]:
        for sigma, outl in GELU_CASES:
            for yt in [np.int8, np.int16]:
                vs_gelu, vs_poly = ibert_gelu_errors(*gelu_input(sigma, outl, xt), yt)
                case = f"{xt.__name__}->{yt.__name__} sigma={sigma} outliers x{outl}"
                print(f"IBertGELU {case}: vs GELU {vs_gelu} | vs float i-GELU {vs_poly}")
    for rows in [layernorm_input, gaussian_rows]:
        for xt in [np.int8, np.int16]:
            for c_len in [192, 768]:
                for yt in [np.int8, np.int16]:
                    o, vs_ln, _, (r0, r1) = l1_layernorm_errors(*rows(xt, c_len), yt)
                    case = f"{rows.__name__} {xt.__name__}->{yt.__name__} C={c_len}"
                    print(f"L1LayerNorm {case}: vs float L1 {o} | vs LN {vs_ln} | r in [{r0:.3f}, {r1:.3f}]")


if __name__ == "__main__":  # pragma: no cover
    table()
