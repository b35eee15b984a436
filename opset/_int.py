"""numpy integer primitives the reference kernels are written in (int64 throughout, floor semantics).

Each has a twin in :mod:`._body` that builds the same arithmetic from standard ONNX ops.
"""

from __future__ import annotations

import numpy as np

#: ``2**62 - 1``: the dividend of the reciprocal in IntDiv, so ``e * floor(M / s) <= M`` for ``e <= s``.
RECIP_M = (1 << 62) - 1


def i64(x) -> np.ndarray:
    return np.asarray(x).astype(np.int64)


def pow2(c) -> np.ndarray:
    """``2**c`` as int64 (``0 <= c <= 62``)."""
    return np.left_shift(np.int64(1), i64(c))


def floor_div(a, d) -> np.ndarray:
    """``floor(a / d)`` for positive ``d``."""
    return np.floor_divide(i64(a), i64(d))


def round_shift(t, c) -> np.ndarray:
    """``floor((t + floor(2**c / 2)) / 2**c)``: round half up, the one rounding rule of every rescale."""
    p = pow2(c)
    return floor_div(i64(t) + p // 2, p)


def saturate(y, qmin: int, qmax: int, dtype) -> np.ndarray:
    """Clip to ``[qmin, qmax]`` then cast (the cast never wraps because of the clip)."""
    return np.clip(y, qmin, qmax).astype(dtype)


def reduce_max(x) -> np.ndarray:
    return np.max(x, axis=-1, keepdims=True)


def reduce_sum(x) -> np.ndarray:
    return np.sum(x, axis=-1, keepdims=True, dtype=np.int64)
