"""The released I-ViT integer kernels, in numpy, for comparison only.

Written from the formulas recorded in DESIGN.md ("I-ViT facts worth knowing") -- the PyTorch release's
IntSoftmax (N=15), IntGELU (N=23) and IntLayerNorm -- in exact int64 arithmetic with floor division,
on the same integer inputs our ops take. They are not part of the project and define nothing; the
approximation tests compare our ops' error against theirs. Outputs are returned as
``(integer values, scale)``; where the release hands a float tensor to the next layer (GELU,
LayerNorm), :func:`quantize` stands for the QuantAct that follows it.
"""

from __future__ import annotations

import math

import numpy as np

INT31 = 2**31 - 1


def _floor_div(a, b):
    return np.floor_divide(np.asarray(a, np.int64), np.asarray(b, np.int64))


def _shift(v, k):
    """``floor(v * 2**k)`` for int64 ``v`` and integer ``k`` of either sign."""
    v, k = np.asarray(v, np.int64), np.asarray(k, np.int64)
    left = np.left_shift(v, np.clip(k, 0, 62))
    right = np.right_shift(v, np.clip(-k, 0, 63))
    return np.where(k >= 0, left, right)


def int_exp_shift(x_int, s: float, n: int) -> np.ndarray:
    """Shift-exp: ``x += x>>1 - x>>4``, ``x0 = floor(-1/s)``, ``x >= n*x0``, ``q = x // x0``,
    ``r = x - q*x0``, ``exp = ((r>>1) - x0) << (n - q)``, clamped at 0; scale ``s / 2**n``."""
    x = np.asarray(x_int, np.int64)
    x = x + (x >> 1) - (x >> 4)
    x0 = math.floor(-1.0 / s)
    x = np.maximum(x, n * x0)
    q = _floor_div(x, x0)
    r = x - q * x0
    return np.maximum(_shift((r >> 1) - x0, n - q), 0)


def int_softmax(x_int, s: float, n: int = 15, k_out: int = 8) -> tuple[np.ndarray, float]:
    """IntSoftmax: ``factor = (2**31-1) // min(sum(exp), 2**31-1)``,
    ``out = (exp * factor) >> (31 - k_out + 1)``; scale ``2**-(k_out-1)``."""
    x = np.asarray(x_int, np.int64)
    e = int_exp_shift(x - x.max(axis=-1, keepdims=True), s, n)
    total = np.minimum(e.sum(axis=-1, keepdims=True), INT31)
    factor = INT31 // total
    return (e * factor) >> (31 - k_out + 1), 2.0 ** -(k_out - 1)


def int_gelu(x_int, s: float, n: int = 23, k_out: int = 8) -> tuple[np.ndarray, float]:
    """IntGELU: 1.702 folded into the scale used for ``x0``; ``sig = e^(x-max) / (e^(x-max) + e^(-max))``
    by the softmax division (``k_out`` bits); ``out = x_int * sig_int``, scale ``s * 2**-(k_out-1)``."""
    x = np.asarray(x_int, np.int64)
    s_sig = s * 1.702
    x_max = x.max(axis=-1, keepdims=True)
    e = int_exp_shift(x - x_max, s_sig, n)
    e_max = int_exp_shift(-x_max, s_sig, n)
    total = np.minimum(e + e_max, INT31)
    factor = INT31 // total
    sig = (e * factor) >> (31 - k_out + 1)
    return x * sig, s * 2.0 ** -(k_out - 1)


def int_layernorm(x_int, gamma, beta) -> tuple[np.ndarray, np.ndarray]:
    """IntLayerNorm: ``var = sum((x - round(mean))**2)``; integer sqrt from ``2**16`` for 10 Newton steps;
    ``y = ((2**31-1) // std * (x - mean)) // 2``, scale ``sqrt(C) / 2**30``; beta folded into an
    integer bias ``floor(beta/gamma / scale)``, gamma into the output scale (per channel)."""
    x = np.asarray(x_int, np.int64)
    c_len = x.shape[-1]
    mean = np.round(x.mean(axis=-1, keepdims=True)).astype(np.int64)  # torch.round: half to even
    y = x - mean
    factor = INT31 // isqrt((y * y).sum(axis=-1, keepdims=True))
    y = (y * factor) // 2
    scale = math.sqrt(c_len) / 2**30
    gamma = np.asarray(gamma, np.float64)
    bias = np.floor(np.asarray(beta, np.float64) / gamma / scale).astype(np.int64)
    return y + bias, scale * gamma


def isqrt(var) -> np.ndarray:
    """IntLayerNorm's square root: 10 Newton steps ``k = (k + var // k) // 2`` from ``k = 2**16``."""
    var = np.asarray(var, np.int64)
    k = np.full_like(var, 2**16)
    for _ in range(10):
        k = (k + var // k) // 2
    return k


def quantize(values, scale, s_y: float, dtype) -> np.ndarray:
    """The QuantAct after a released kernel: ``clip(round(values * scale / s_y))`` to ``dtype``."""
    info = np.iinfo(dtype)
    q = np.round(np.asarray(values, np.float64) * scale / s_y)
    return np.clip(q, info.min, info.max).astype(dtype)
