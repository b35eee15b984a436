"""How close the integer ops come to float, and to the released I-ViT kernels on the same integers.

Each case quantizes a realistic float tensor to integers once; the float reference is computed from
those same integers (so only the op's own approximation is measured), and every error is an absolute
error in the op's output units, also stated in LSBs of the output scale ``s_y``. Our ops are set up
as the converter sets them up (``passes/rules/nonlinear.py``): Shiftmax/ShiftGELU inputs upscaled
exactly onto a grid of at least 1/1024 (:func:`tests.opset.oneop.fine_grid`), ``n`` from ``max_n``,
ShiftGELU with 15 sigmoid bits, ILayerNorm with ``p = 30`` and the widest ``shift_in``. The released
kernels (:mod:`tests.opset.released_ivit`) get the same integers and their own fixed N; their float
outputs are quantized to the same ``s_y`` as ours (the QuantAct that follows them), so both sides
are compared at the same output precision. Bounds were set from measurements with some margin.

``python -m tests.opset.test_approx`` (from the repository root) prints the measured table.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pytest
from scipy.special import erf

from ivit_onnx import qparams
from ivit_onnx.affine import Affine
from ivit_onnx.opset import OPS
from tests.opset import released_ivit as released
from tests.opset.oneop import fine_grid, ilayernorm_params, info, shiftgelu_params, shiftmax_params


@dataclass
class Err:
    mean: float
    max: float
    lsb: float  # the output scale the errors are measured against

    @classmethod
    def of(cls, got, want, lsb: float) -> Err:
        e = np.abs(np.asarray(got, np.float64) - want)
        return cls(float(e.mean()), float(e.max()), lsb)

    def __str__(self) -> str:
        lsb = f"{self.mean / self.lsb:.3f} / {self.max / self.lsb:.2f} LSB"
        return f"mean {self.mean:.2e} max {self.max:.2e} ({lsb})"


def no_worse(ours: Err, theirs: Err) -> None:
    assert ours.mean <= theirs.mean, f"mean error {ours} worse than released {theirs}"
    assert ours.max <= theirs.max, f"max error {ours} worse than released {theirs}"


# -------------------------------------------------------------------------------------------- Shiftmax


def softmax(z):
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def our_shiftmax(x, s: float, yt, bits: int) -> np.ndarray:
    xu, m = fine_grid(x, 1.0 / s)
    attrs = shiftmax_params(s / m, x.shape[-1], bits)
    return OPS["Shiftmax"].run(xu, yt(0), **attrs).astype(np.float64) * 2.0**-bits


def int8_scores(sigma: float, row: int = 197, seed: int = 0):
    """Attention-like scores: normal with a few strongly attended tokens, quantized to int8."""
    rng = np.random.default_rng(seed)
    z = rng.normal(0, sigma, (2, 3, row, row))
    z[..., :5] += 2 * sigma
    s = float(np.abs(z).max() / 127)
    return np.clip(np.round(z / s), -128, 127).astype(np.int8), s


def int32_scores(row: int, d: int = 64, seed: int = 0, queries: int | None = None, heads=(2, 3)):
    """``q @ k^T`` of int8 q, k (rows of ``row`` keys): int32 accumulators, scale ``s_q * s_k / sqrt(d)``."""
    rng = np.random.default_rng(seed)
    q, k = rng.normal(0, 1, (*heads, queries or row, d)), rng.normal(0, 1, (*heads, row, d))
    s_q, s_k = np.abs(q).max() / 127, np.abs(k).max() / 127
    acc = np.round(q / s_q).astype(np.int32) @ np.swapaxes(np.round(k / s_k).astype(np.int32), -1, -2)
    return acc.astype(np.int32), float(s_q * s_k / math.sqrt(d))


def shiftmax_errors(x, s):
    want = softmax(x.astype(np.float64) * s)
    ours7 = Err.of(our_shiftmax(x, s, np.int8, 7), want, 2.0**-7)
    ours16 = Err.of(our_shiftmax(x, s, np.int16, 15), want, 2.0**-15)
    y, scale = released.int_softmax(x, s)
    return ours7, ours16, Err.of(y * scale, want, 2.0**-7)


# |Shiftmax - softmax| with 7 fraction bits (int8 output, scale 2**-7): measured max 2.9 LSB, mean 0.50 LSB
SHIFTMAX_MAX_7 = 3.5 * 2.0**-7
SHIFTMAX_MEAN_7 = 0.6 * 2.0**-7
# with 15 fraction bits the exp approximation dominates: measured max 0.0156, mean 1.1e-4
SHIFTMAX_MAX_15 = 0.018
SHIFTMAX_MEAN_15 = 1.5e-4


@pytest.mark.parametrize("sigma", [0.5, 1.0, 3.0, 6.0, 12.0])
def test_shiftmax_int8_scores(sigma):
    x, s = int8_scores(sigma)
    ours7, ours16, rel = shiftmax_errors(x, s)
    assert ours7.max <= SHIFTMAX_MAX_7 and ours7.mean <= SHIFTMAX_MEAN_7, ours7
    assert ours16.max <= SHIFTMAX_MAX_15 and ours16.mean <= SHIFTMAX_MEAN_15, ours16
    no_worse(ours7, rel)


LONG = {1024: {"queries": 256, "heads": (1, 2)}, 4096: {"queries": 64, "heads": (1, 1)}}  # fewer query rows


@pytest.mark.parametrize("row", [197, 1024, 4096])
def test_shiftmax_int32_accumulators(row):
    x, s = int32_scores(row, seed=row, **LONG.get(row, {}))
    ours7, ours16, rel = shiftmax_errors(x, s)
    assert ours7.max <= SHIFTMAX_MAX_7 and ours7.mean <= SHIFTMAX_MEAN_7, ours7
    assert ours16.max <= SHIFTMAX_MAX_15 and ours16.mean <= SHIFTMAX_MEAN_15, ours16
    no_worse(ours7, rel)


# ------------------------------------------------------------------------------------------- ShiftGELU


def gelu(z):
    return 0.5 * z * (1 + erf(z / math.sqrt(2)))


def gelu_input(sigma: float, outliers: float, xt, seed: int = 0):
    """fc1-like pre-activations, a few outlier channels ``outliers`` times wider, quantized to ``xt``."""
    rng = np.random.default_rng(seed)
    z = rng.normal(0, sigma, (2, 197, 768))
    z[..., :3] *= outliers
    qmax = info(xt)[1]
    s = float(np.abs(z).max() / qmax)
    return np.clip(np.round(z / s), -qmax - 1, qmax).astype(xt), s


def our_shiftgelu(x, s: float, s_y: float, yt, bits: int = 15) -> np.ndarray:
    xu, m = fine_grid(x, 1.0 / (1.702 * s))
    lo, hi = info(yt)
    attrs, b, c = shiftgelu_params(s / m, s_y, int(np.abs(xu.astype(np.int64)).max()), bits, lo, hi)
    return OPS["ShiftGELU"].run(xu, b, c, yt(0), **attrs).astype(np.float64) * s_y


def shiftgelu_errors(x, s, yt):
    want = gelu(x.astype(np.float64) * s)
    s_y = float(np.abs(want).max() / info(yt)[1])
    ours = Err.of(our_shiftgelu(x, s, s_y, yt), want, s_y)
    y, scale = released.int_gelu(x, s)
    rel = Err.of(released.quantize(y, scale, s_y, yt).astype(np.float64) * s_y, want, s_y)
    return ours, rel


#: max |x sigmoid(1.702 x) - GELU(x)| over the reals: the approximation ShiftGELU is built on
SIGMOID_GELU_GAP = 0.0204

GELU_CASES = [(1.0, 1.0), (1.0, 4.0), (2.0, 1.0), (2.0, 4.0), (4.0, 1.0), (4.0, 4.0)]


@pytest.mark.parametrize("xt", [np.int8, np.int16])
@pytest.mark.parametrize("sigma,outliers", GELU_CASES)
def test_shiftgelu_int8_output(sigma, outliers, xt):
    x, s = gelu_input(sigma, outliers, xt)
    ours, rel = shiftgelu_errors(x, s, np.int8)
    # int8 output: measured max 1.14 LSB, mean 0.33 LSB (rounding the exact GELU alone: 0.5 / 0.25)
    assert ours.max <= 1.25 * ours.lsb and ours.mean <= 0.4 * ours.lsb, ours
    no_worse(ours, rel)


@pytest.mark.parametrize("xt", [np.int8, np.int16])
@pytest.mark.parametrize("sigma,outliers", GELU_CASES)
def test_shiftgelu_int16_output(sigma, outliers, xt):
    x, s = gelu_input(sigma, outliers, xt)
    ours, rel = shiftgelu_errors(x, s, np.int16)
    # int16 output: the sigmoid form itself is off by up to 0.0204 (measured max 0.0245, mean 0.0091)
    assert ours.max <= SIGMOID_GELU_GAP + 0.0065, ours
    assert ours.mean <= 0.011, ours
    no_worse(ours, rel)


def test_sigmoid_gelu_gap():
    z = np.linspace(-12, 12, 240001)
    gap = np.abs(z / (1 + np.exp(-1.702 * z)) - gelu(z)).max()
    assert SIGMOID_GELU_GAP - 1e-4 <= gap <= SIGMOID_GELU_GAP


# ------------------------------------------------------------------------------------------ ILayerNorm


def layernorm_input(xt, c_len: int, seed: int = 0):
    """Residual-stream-like rows: per-row offset and spread, two outlier channels; quantized to ``xt``."""
    rng = np.random.default_rng(seed)
    z = rng.normal(0, 1, (2, 197, c_len)) * np.exp(rng.normal(0, 0.5, (2, 197, 1)))
    z += rng.normal(0, 0.5, (2, 197, 1))
    z[..., :2] *= 4 if xt == np.int8 else 20
    qmax = info(xt)[1]
    s = float(np.abs(z).max() / qmax)
    gamma, beta = rng.normal(1, 0.3, c_len), rng.normal(0, 0.3, c_len)
    return np.clip(np.round(z / s), -qmax - 1, qmax).astype(xt), s, gamma, beta


def ilayernorm_errors(x, s, gamma, beta, yt):
    xf = x.astype(np.float64) * s
    want = (xf - xf.mean(-1, keepdims=True)) / xf.std(-1, keepdims=True) * gamma + beta
    lo, hi = info(yt)
    s_y = float(np.abs(want).max() / hi)
    xlo, xhi = info(x.dtype)
    attrs, b, c, bias = ilayernorm_params(gamma, beta, s_y, xhi - xlo, lo, hi)
    ours = Err.of(OPS["ILayerNorm"].run(x, b, c, bias, yt(0), **attrs).astype(np.float64) * s_y, want, s_y)
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


def our_ibert_gelu(x, s: float, s_y: float, yt) -> np.ndarray:
    """IBertGELU with the converter's parameters (``qparams.ibert_gelu``: upscale, clip, coeff, k, b, c)."""
    a = Affine(np.float64(s), 0, x.dtype, bound=int(np.abs(x.astype(np.int64)).max()))
    gp = qparams.ibert_gelu(a, Affine(np.float64(s_y), 0, yt), 1024, 15)
    xu = (x.astype(np.int64) * gp.up.m).astype(np.int32)
    lo, hi = info(yt)
    y = OPS["IBertGELU"].run(xu, gp.multiplier, gp.shift, yt(0), clip=gp.clip, coeff=gp.coeff, k=gp.k,
                             qmin=lo, qmax=hi)
    return y.astype(np.float64) * s_y


def ibert_gelu_errors(x, s, yt) -> tuple[Err, Err]:
    """Against the erf GELU, and against the float i-GELU it implements (the integer arithmetic's share)."""
    z = x.astype(np.float64) * s
    want = gelu(z)
    s_y = float(np.abs(want).max() / info(yt)[1])
    got = our_ibert_gelu(x, s, s_y, yt)
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


#: L1LayerNorm's sigma estimate: sqrt(pi/2) mean|x - mean| (exact in expectation for normal rows)
L1_SIGMA = math.sqrt(math.pi / 2)


def gaussian_rows(xt, c_len: int, seed: int = 0):
    """:func:`layernorm_input` without the outlier channels: rows that are normal up to offset and spread."""
    rng = np.random.default_rng(seed)
    z = rng.normal(0, 1, (2, 197, c_len)) * np.exp(rng.normal(0, 0.5, (2, 197, 1)))
    z += rng.normal(0, 0.5, (2, 197, 1))
    qmax = info(xt)[1]
    s = float(np.abs(z).max() / qmax)
    gamma, beta = rng.normal(1, 0.3, c_len), rng.normal(0, 0.3, c_len)
    return np.clip(np.round(z / s), -qmax - 1, qmax).astype(xt), s, gamma, beta


def l1_layernorm_errors(x, s, gamma, beta, yt):
    """``(vs float L1 LayerNorm, vs LayerNorm, within the latter's bound, sigma/(L1_SIGMA mad) range)``.

    ``s_y`` is LayerNorm's (what a model calibrated in float uses). L1 LayerNorm's normalized value is
    LayerNorm's times ``r = sigma / (L1_SIGMA mean|x - mean|)`` per row, so
    ``|ours - LN| <= |LN - beta| |r - 1|`` plus our own rounding error: the bound checked, per element.
    """
    xf = x.astype(np.float64) * s
    dev = xf - xf.mean(-1, keepdims=True)
    ln = dev / xf.std(-1, keepdims=True) * gamma + beta
    r = xf.std(-1, keepdims=True) / (L1_SIGMA * np.abs(dev).mean(-1, keepdims=True))
    lo, hi = info(yt)
    s_y = float(np.abs(ln).max() / hi)
    a = Affine(np.float64(s), 0, x.dtype, bound=int(np.abs(x.astype(np.int64)).max()))
    lp = qparams.l1_layernorm(a, x.shape[-1], gamma, beta, Affine(np.float64(s_y), 0, yt), 30)
    assert lp.pre is None
    y = OPS["L1LayerNorm"].run(x, lp.multiplier, lp.shift, lp.bias, yt(0), shift_in=lp.shift_in, p=lp.p,
                               qmin=lo, qmax=hi).astype(np.float64) * s_y
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
    for sigma in [0.5, 1.0, 3.0, 6.0, 12.0]:
        o7, o16, rel = shiftmax_errors(*int8_scores(sigma))
        print(f"Shiftmax int8 scores sigma={sigma}: ours(7b) {o7} | ours(15b) {o16} | released {rel}")
    for row in [197, 1024, 4096]:
        x, s = int32_scores(row, seed=row, **LONG.get(row, {}))
        o7, o16, rel = shiftmax_errors(x, s)
        print(f"Shiftmax int32 acc row={row}: ours(7b) {o7} | ours(15b) {o16} | released {rel}")
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
