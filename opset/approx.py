"""How close the integer Softmax, GELU and LayerNorm kernels come to the float functions they stand for.

One place for what the approximation tests (``tests/opset/test_approx*.py``) and the ablation benchmark
(``benchmarks/bench_ablation.py``) measure: realistic integer inputs (attention scores, fc1 pre-activations,
residual-stream rows), the float functions, and each kernel run as the converter sets it up (its parameters
from :mod:`ivit_onnx.qparams`, its input rescaled as ``passes/rules/nonlinear.py`` emits it). The float
reference is computed from the same integers, so only the kernel's own approximation is measured; errors are
absolute, in the op's output units, and in LSBs of the output scale. :func:`operating_range` sums one kernel
up over all its cases (the benchmark's error columns). GELU's erf needs scipy (the ``models`` extra has it).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from .. import qparams
from ..affine import Affine, dtype_range
from . import OPS

#: the private op of each ``Options`` choice, by the op it replaces (a view of ``qparams.KERNELS``)
KERNEL_OPS = {kind: {c: k.op for c, k in choices.items()} for kind, choices in qparams.KERNELS.items()}
#: the converter's defaults (``Options``): the finest exp grid, GELU's sigmoid/Phi bits, LayerNorm's p
MIN_X0, GELU_BITS, LN_P = 1024, 15, 30


@dataclass
class Err:
    """Mean and max absolute error, and the output scale ``lsb`` they are also stated in."""

    mean: float
    max: float
    lsb: float

    @classmethod
    def of(cls, got, want, lsb: float) -> Err:
        e = np.abs(np.asarray(got, np.float64) - want)
        return cls(float(e.mean()), float(e.max()), lsb)

    @property
    def mean_lsb(self) -> float:
        return self.mean / self.lsb

    @property
    def max_lsb(self) -> float:
        return self.max / self.lsb

    def __str__(self) -> str:
        return f"mean {self.mean:.2e} max {self.max:.2e} ({self.mean_lsb:.3f} / {self.max_lsb:.2f} LSB)"


# ------------------------------------------------------------------------------------ the float functions


def softmax(z):
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def gelu(z):
    from scipy.special import erf

    return 0.5 * z * (1 + erf(z / math.sqrt(2)))


def layernorm(xf, gamma, beta):
    """LayerNorm over the last axis (no epsilon: the rows are never constant here)."""
    return (xf - xf.mean(-1, keepdims=True)) / xf.std(-1, keepdims=True) * gamma + beta


# ------------------------------------------------------------------------------------------ the inputs


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


#: score spreads of the int8 cases, row lengths of the int32 ones (fewer query rows for the long rows)
SIGMAS = [0.5, 1.0, 3.0, 6.0, 12.0]
ROWS = [197, 1024, 4096]
LONG = {1024: {"queries": 256, "heads": (1, 2)}, 4096: {"queries": 64, "heads": (1, 1)}}


def softmax_cases() -> Iterator[tuple[str, tuple[np.ndarray, float]]]:
    """``(name, (scores, scale))``: int8 scores of each spread, then int32 ``q.k`` accumulators per row."""
    for sigma in SIGMAS:
        yield f"int8 scores sigma={sigma}", int8_scores(sigma)
    for row in ROWS:
        yield f"int32 q.k row={row}", int32_scores(row, seed=row, **LONG.get(row, {}))


#: ``(sigma, outliers)`` of the GELU inputs
GELU_CASES = [(1.0, 1.0), (1.0, 4.0), (2.0, 1.0), (2.0, 4.0), (4.0, 1.0), (4.0, 4.0)]


def _quantize(z, xt):
    qmax = dtype_range(xt)[1]
    s = float(np.abs(z).max() / qmax)
    return np.clip(np.round(z / s), -qmax - 1, qmax).astype(xt), s


def gelu_input(sigma: float, outliers: float, xt, seed: int = 0):
    """fc1-like pre-activations, a few outlier channels ``outliers`` times wider, quantized to ``xt``."""
    rng = np.random.default_rng(seed)
    z = rng.normal(0, sigma, (2, 197, 768))
    z[..., :3] *= outliers
    return _quantize(z, xt)


def _rows(xt, c_len: int, seed: int, outliers: bool):
    rng = np.random.default_rng(seed)
    z = rng.normal(0, 1, (2, 197, c_len)) * np.exp(rng.normal(0, 0.5, (2, 197, 1)))
    z += rng.normal(0, 0.5, (2, 197, 1))
    if outliers:
        z[..., :2] *= 4 if xt == np.int8 else 20
    gamma, beta = rng.normal(1, 0.3, c_len), rng.normal(0, 0.3, c_len)
    return (*_quantize(z, xt), gamma, beta)


def layernorm_input(xt, c_len: int, seed: int = 0):
    """Residual-stream-like rows: per-row offset and spread, two outlier channels; quantized to ``xt``.
    Returns ``(x, scale, gamma, beta)``."""
    return _rows(xt, c_len, seed, outliers=True)


def gaussian_rows(xt, c_len: int, seed: int = 0):
    """:func:`layernorm_input` without the outlier channels: rows that are normal up to offset and spread."""
    return _rows(xt, c_len, seed, outliers=False)


def out_scale(want, yt) -> float:
    """The output scale a model calibrated in float gives: the float result's range over ``yt``'s."""
    return float(np.abs(want).max() / dtype_range(yt)[1])


# ---------------------------------------------------------------- the kernels, as the converter runs them


def _type(x: np.ndarray, s: float) -> Affine:
    return Affine(np.float64(s), 0, x.dtype, bound=int(np.abs(x.astype(np.int64)).max()))


def _rescale(x: np.ndarray, m: int, c: int, t: Affine) -> np.ndarray:
    """The Requantize ``round_shift(x * m, c)`` into ``t`` that the converter puts before a kernel."""
    if (m, c) == (1, 0):
        return x
    lo, hi = t.qrange
    return OPS["Requantize"].run(x, x.dtype.type(0), np.int64(m), np.int64(c), np.int32(0), qmin=lo, qmax=hi)


def run_softmax(op: str, x: np.ndarray, s: float, yt, bits: int, min_x0: int = MIN_X0) -> np.ndarray:
    """Softmax kernel ``op`` on integer scores ``x`` of scale ``s``, written at ``2**-bits`` in ``yt`` (zero
    point 0), read back as probabilities."""
    a, target, row = _type(x, s), Affine(np.float64(2.0**-bits), 0, yt), x.shape[-1]
    if op == "Shiftmax":
        sp = qparams.shiftmax(a, row, target, min_x0)
        y = OPS[op].run(_rescale(x, sp.up.m, 0, sp.up.a), yt(0), x0=sp.x0, n=sp.n, bits=sp.bits)
        t = sp.t
    else:
        pp = qparams.poly_softmax(a, row, target, min_x0)
        y = OPS[op].run(_rescale(x, pp.grid.m, pp.grid.c, pp.grid.a), yt(0), **pp.attrs(op))
        t = pp.t
    return y.astype(np.float64) * float(t.scale)


def run_gelu(op: str, x: np.ndarray, s: float, s_y: float, yt, min_x0: int = MIN_X0,
             bits: int = GELU_BITS) -> np.ndarray:
    """GELU kernel ``op`` on integers ``x`` of scale ``s``, requantized into ``yt`` at ``s_y``; real units."""
    kernel = qparams.BY_OP[op]
    gp = kernel.params(_type(x, s), Affine(np.float64(s_y), 0, yt), min_x0, bits)
    lo, hi = dtype_range(yt)
    attrs = {k: getattr(gp, k) for k in kernel.attrs}
    xu = _rescale(x, gp.up.m, 0, gp.up.a)
    y = OPS[op].run(xu, gp.multiplier, gp.shift, yt(0), **attrs, qmin=lo, qmax=hi)
    return y.astype(np.float64) * s_y


def run_layernorm(op: str, x: np.ndarray, s: float, gamma, beta, s_y: float, yt, p: int = LN_P) -> np.ndarray:
    """LayerNorm kernel ``op`` on rows ``x`` of scale ``s``, gamma/beta folded, into ``yt`` at ``s_y``."""
    a, t = _type(x, s), Affine(np.float64(s_y), 0, yt)
    lp = qparams.BY_OP[op].params(a, x.shape[-1], np.asarray(gamma), np.asarray(beta), t, p)
    if lp.pre is not None:
        b, c = qparams.requantize(a, lp.pre)
        lo, hi = lp.pre.qrange
        x = OPS["Requantize"].run(x, x.dtype.type(0), b, c, np.int32(0), qmin=lo, qmax=hi)
    lo, hi = dtype_range(yt)
    attrs = {"shift_in": lp.shift_in, "p": lp.p, "qmin": lo, "qmax": hi}
    y = OPS[op].run(x, lp.multiplier, lp.shift, lp.bias, yt(0), **attrs)
    return y.astype(np.float64) * s_y


# ------------------------------------------------------------------------- one kernel, its whole range


#: the output each op is measured at in :func:`operating_range`: the models' (uint8 probabilities at 2**-8,
#: int8 GELU and LayerNorm outputs at the float result's range)
OUTPUTS = {"softmax": "uint8 at 2^-8", "gelu": "int8", "layernorm": "int8"}


def _errors(kind: str, op: str) -> Iterator[Err]:
    """The kernel's error against the float op it replaces, case by case (see :func:`operating_range`)."""
    if kind == "softmax":
        for _, (x, s) in softmax_cases():
            yield Err.of(run_softmax(op, x, s, np.uint8, 8), softmax(x.astype(np.float64) * s), 2.0**-8)
    elif kind == "gelu":
        for xt in (np.int8, np.int16):
            for sigma, outliers in GELU_CASES:
                x, s = gelu_input(sigma, outliers, xt)
                want = gelu(x.astype(np.float64) * s)
                s_y = out_scale(want, np.int8)
                yield Err.of(run_gelu(op, x, s, s_y, np.int8), want, s_y)
    else:
        for rows in (layernorm_input, gaussian_rows):
            for xt in (np.int8, np.int16):
                for c_len in (192, 768):
                    x, s, gamma, beta = rows(xt, c_len)
                    want = layernorm(x.astype(np.float64) * s, gamma, beta)
                    s_y = out_scale(want, np.int8)
                    yield Err.of(run_layernorm(op, x, s, gamma, beta, s_y, np.int8), want, s_y)


def operating_range(kind: str, choice: str) -> dict:
    """The ``Options.<kind>`` kernel ``choice`` against the float op it replaces (softmax, erf GELU,
    LayerNorm) over every case of this module: Softmax on the int8 scores of each spread and the int32
    ``q.k`` rows of 197 to 4096; GELU on int8 and int16 fc1-like inputs with and without outlier channels;
    LayerNorm on residual-like (outlier channels) and normal rows, int8 and int16, 192 and 768 channels.
    Errors in LSBs of the output (:data:`OUTPUTS`): the largest over all cases, and the mean of the cases'
    means."""
    op = KERNEL_OPS[kind][choice]
    errs = list(_errors(kind, op))
    return {"op": op, "output": OUTPUTS[kind], "cases": len(errs),
            "max_lsb": max(e.max_lsb for e in errs), "mean_lsb": float(np.mean([e.mean_lsb for e in errs]))}
