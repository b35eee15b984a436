"""The integer parameters of every lowered op, derived from affine types: one place, two users.

The converter's rules (``passes/rules``) and the QAT modules (``models/qat.py``) both call these, so
the shift-exp ``n``, the exp grid ``x0``, the output bits and every dyadic pair of a model trained with
QAT are, by construction, those ``ivit-onnx rewrite`` writes into its integer graph. Each function
takes the input's :class:`~ivit_onnx.affine.Affine` type (scale, zero point, dtype, bound) and the
target type (the following QuantizeLinear's, or ``None``) and returns the op's parameters and output
type. ``dy`` is the dyadic approximation (``dyadic_array``'s signature); the converter passes one that
also records the error for its report.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .affine import Affine, dtype_range
from .dyadic import dyadic_array, multiplier_bits
from .opset.shift_exp import max_n

INT32_MAX = 2**31 - 1
#: Shiftmax output bits when the next QuantizeLinear's scale is not a power of two (int32, then requantized)
SOFTMAX_DEFAULT_BITS = 16
#: ShiftExp multiplies by 1.0111b = 1.4375 for log2(e); choosing x0 = 1.4375 / (log2(e) * s) instead of the
#: paper's round(1/s) cancels that 0.36 % slope error exactly (up to x0's rounding, < 0.05 % for x0 >= 1024)
LOG2E_FIX = 1.4375 / math.log2(math.e)
#: the GELU fold of I-ViT: sigmoid(1.702 x)
GELU_SIGMOID = 1.702
#: I-BERT's erf polynomial (Kim et al. 2021) L(z) = sign(z) (a (min(|z|, -b) + b)**2 + 1) for GELU's erf
IBERT_ERF_A, IBERT_ERF_B = -0.2888, -1.769
#: the standard deviation of a normal row over its mean absolute deviation: L1LayerNorm's sigma
L1_SIGMA = math.sqrt(math.pi / 2)

Dyadic = Callable[..., tuple[np.ndarray, np.ndarray]]


def plain_dyadic(m, bits: int, what: str, allow_negative: bool = False):
    """``dyadic_array`` with the converter's call signature (no error bookkeeping)."""
    return dyadic_array(np.asarray(m), bits, what=what, allow_negative=allow_negative)


# ---- rescales -------------------------------------------------------------------------------------------


def requantize(a: Affine, t: Affine, dy: Dyadic = plain_dyadic) -> tuple[np.ndarray, np.ndarray]:
    """``(b, c)`` of the Requantize from ``a`` to ``t``: ``b/2**c ~ s_a/s_t``, ``b`` sized by ``a.bound``."""
    ratio = np.broadcast_to(a.scale / t.scale, np.broadcast_shapes(a.scale.shape, t.scale.shape))
    return dy(ratio, multiplier_bits(a.bound), "requantize multiplier")


def per_tensor(a: Affine) -> Affine:
    """The per-tensor int32 type a per-channel accumulator is requantized to (its finest channel scale)."""
    s = float(a.scale.min())
    return Affine(
        np.float64(s), 0, np.int32, bound=min(int(a.bound * float(a.scale.max()) / s) + 1, INT32_MAX)
    )


def accumulator(a: Affine, b: Affine, k: int) -> Affine:
    """The int32 type of an integer MatMul/Conv of ``a`` and ``b`` over ``k`` products."""
    return Affine(a.scale * b.scale, 0, np.int32, bound=min(k * a.bound * b.bound, INT32_MAX))


def conv_accumulator(x: Affine, w: Affine, k: int, nd: int) -> Affine:
    """The int32 type of an integer Conv (``k`` products per output, ``nd`` spatial dims): per channel
    ``s_x * s_w[c]`` shaped ``[C, 1, ...]`` when the weights are per channel."""
    scale = (
        np.asarray(x.scale * w.scale.reshape(-1)).reshape([-1] + [1] * nd)
        if w.scale.size > 1
        else x.scale * w.scale
    )
    return Affine(scale, 0, np.int32, bound=min(k * x.bound * w.bound, INT32_MAX))


def bias(a: Affine, value: np.ndarray) -> tuple[np.ndarray, Affine]:
    """A float bias rounded to the accumulator's scale (int32, as I-ViT) and the type of ``acc + bias``."""
    q = np.rint(value.astype(np.float64) / a.scale)
    if np.max(np.abs(q), initial=0) > INT32_MAX:
        raise ValueError(f"bias does not fit int32 at scale {a.describe()}")
    q = q.astype(np.int32)
    return q, Affine(a.scale, 0, np.int32, bound=min(a.bound + int(np.max(np.abs(q), initial=0)), INT32_MAX))


def _shift_for(ratio: np.ndarray, bound: int) -> int:
    """Largest shift ``c`` keeping ``bound * ratio * 2**c`` within a signed 61-bit sum term."""
    top = float(np.max(ratio)) * max(bound, 1)
    return int(min(62, np.floor(60 - np.log2(top))))


def iadd_type(a: Affine, b: Affine) -> Affine:
    """The output type of an IAdd with no QuantizeLinear after it: int32 at the finer scale."""
    s = float(min(a.scale.min(), b.scale.min()))
    bound = min(int(a.bound * a.scale.max() / s + b.bound * b.scale.max() / s) + 2, INT32_MAX)
    return Affine(np.float64(s), 0, np.int32, bound=bound)


def iadd(a: Affine, b: Affine, t: Affine) -> tuple[np.ndarray, np.ndarray, int]:
    """``(ma, mb, c)`` of an IAdd into ``t``: one shift for both ``s_a/s_t`` and ``s_b/s_t``."""
    ra, rb = a.scale / t.scale, b.scale / t.scale
    c = min(_shift_for(ra, a.bound), _shift_for(rb, b.bound))
    if c < 0:
        raise ValueError("scale ratio too large for IAdd")
    return np.rint(np.ldexp(ra, c)).astype(np.int64), np.rint(np.ldexp(rb, c)).astype(np.int64), c


def concat_type(types: list[Affine]) -> Affine:
    """A Concat with no QuantizeLinear after it: inputs of one type keep it (torch.roll's Slice+Concat, a
    class token quantized like the patches), else the widest input type at a scale holding every input."""
    if all(types[0].same_as(a) for a in types[1:]):
        return Affine(types[0].scale, types[0].zero_point, types[0].dtype, bound=max(a.bound for a in types))
    dt = max(
        (np.dtype(np.int16) if a.dtype == np.uint8 else a.dtype for a in types), key=lambda d: d.itemsize
    )
    reach = max(float(a.scale) * a.bound for a in types)
    return Affine(np.float64(max(min(float(a.scale) for a in types), reach / dtype_range(dt)[1])), 0, dt)


# ---- nonlinear ops --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Upscale:
    """The exact integer upscale ``q * m`` (Requantize, shift 0) before a shift-exp; ``m == 1``: none."""

    m: int
    a: Affine  #: the type after it
    x0_real: float  #: the exp grid on it


def fine_grid(a: Affine, x0_real: float, min_x0: int) -> Upscale:
    """Upscale until ``x0_real`` reaches ``min_x0`` (int32 bound permitting) so ``round(x0)`` is precise."""
    m = max(1, math.ceil(min_x0 / x0_real))
    if m > 1:
        t = Affine(a.scale / m, 0, np.int32, bound=min(a.bound * m, INT32_MAX))
        if a.bound * m >= 2**31:
            m = max(1, INT32_MAX // max(a.bound, 1))
            t = Affine(a.scale / m, 0, np.int32, bound=a.bound * m)
        if m > 1:
            return Upscale(m, t, x0_real * m)
    return Upscale(1, a, x0_real * m)


@dataclass(frozen=True)
class ShiftmaxParams:
    up: Upscale
    x0: int
    n: int
    bits: int
    t: Affine  #: output type


def _pow2_bits(t: Affine | None) -> int | None:
    """``k`` when ``t`` is per tensor with scale ``2**-k`` and room for ``zp + 2**k - 1``, else None."""
    if t is None or not t.per_tensor:
        return None
    k = -math.log2(float(t.scale))
    lo, hi = t.qrange
    k = round(k) if abs(k - round(k)) < 1e-9 else 0
    return k if 1 <= k <= 30 and t.zero_point >= lo and t.zero_point + 2**k - 1 <= hi else None


def shiftmax(a: Affine, row: int, target: Affine | None, min_x0: int) -> ShiftmaxParams:
    """Shiftmax of a per-tensor ``a`` in rows of ``row``, written at the target's ``2**-bits`` if it can."""
    up = fine_grid(a, LOG2E_FIX / float(a.scale), min_x0)
    x0 = int(round(up.x0_real))
    bits = _pow2_bits(target)
    if bits is None:
        bits = SOFTMAX_DEFAULT_BITS
        target = Affine(np.float64(2.0**-bits), 0, np.int32, bound=2**bits)
    return ShiftmaxParams(up, x0, max_n(x0, row), bits, target)


@dataclass(frozen=True)
class ShiftGeluParams:
    up: Upscale
    x0: int
    n: int
    bits: int
    multiplier: np.ndarray
    shift: np.ndarray
    t: Affine


def shiftgelu(
    a: Affine, target: Affine | None, min_x0: int, bits: int, dy: Dyadic = plain_dyadic
) -> ShiftGeluParams:
    """ShiftGELU of a symmetric per-tensor ``a``, requantized into ``target`` (int32 at ``a`` if None)."""
    up = fine_grid(a, LOG2E_FIX / (GELU_SIGMOID * float(a.scale)), min_x0)
    x0 = int(round(up.x0_real))
    a = up.a
    t = target or Affine(a.scale, 0, np.int32, bound=a.bound)
    b, c = dy(float(a.scale) * 2.0**-bits / t.scale, multiplier_bits(a.bound << bits), "GELU rescale")
    return ShiftGeluParams(up, x0, max_n(x0, 1), bits, b, c, t)


@dataclass(frozen=True)
class IBertGeluParams:
    up: Upscale
    clip: int
    coeff: int
    k: int
    multiplier: np.ndarray
    shift: np.ndarray
    t: Affine


def ibert_gelu(
    a: Affine, target: Affine | None, min_x0: int, bits: int, dy: Dyadic = plain_dyadic
) -> IBertGeluParams:
    """I-BERT's i-GELU of a symmetric per-tensor ``a``, requantized into ``target`` (int32 at ``a`` if None):
    erf's clip point ``-b/s'`` (``s' = s/sqrt 2``) at least ``min_x0`` grid steps (exact upscale first, as the
    shift-exps' grid), ``coeff = round(-1/(a s'**2))``, ``k`` leaving ``bits`` fraction bits of ``Phi``."""
    up = fine_grid(a, -IBERT_ERF_B * math.sqrt(2) / float(a.scale), min_x0)
    s_erf = float(up.a.scale) / math.sqrt(2)
    clip = int(round(-IBERT_ERF_B / s_erf))
    coeff = max(int(round(-1.0 / (IBERT_ERF_A * s_erf**2))), clip * clip)  # the op's precondition
    k = max(0, coeff.bit_length() - bits)
    if clip >= 2**31 or coeff + (1 << k) >= 2**62:
        raise ValueError(f"GELU input scale {float(a.scale):.3g} too fine for the erf polynomial")
    d = (coeff + (1 << k >> 1)) >> k  # round_shift(coeff, k): g = x's Phi * 2 D
    t = target or Affine(up.a.scale, 0, np.int32, bound=up.a.bound)
    b, c = dy(float(up.a.scale) / (2 * d * t.scale), multiplier_bits(up.a.bound * 2 * d), "GELU rescale")
    return IBertGeluParams(up, clip, coeff, k, b, c, t)


@dataclass(frozen=True)
class LayerNormParams:
    pre: Affine | None  #: a narrower type to requantize the input to first (too wide for exact variance)
    shift_in: int
    p: int
    multiplier: np.ndarray
    shift: np.ndarray
    bias: np.ndarray
    t: Affine


def layernorm(
    a: Affine,
    c_len: int,
    gamma: np.ndarray,
    beta: np.ndarray | None,
    target: Affine | None,
    p: int,
    dy: Dyadic = plain_dyadic,
) -> LayerNormParams:
    """ILayerNorm over rows of ``c_len``: ``b/2**c ~ sqrt(C) gamma/(2**p s_y)``, ``bias ~ beta/s_y 2**c``."""
    return _layernorm(a, c_len, gamma, beta, target, p, dy, math.sqrt(c_len))


def l1_layernorm(
    a: Affine,
    c_len: int,
    gamma: np.ndarray,
    beta: np.ndarray | None,
    target: Affine | None,
    p: int,
    dy: Dyadic = plain_dyadic,
) -> LayerNormParams:
    """L1LayerNorm over rows of ``c_len``: ``b/2**c ~ C gamma/(sqrt(pi/2) 2**p s_y)``, ``bias`` as
    ILayerNorm's; centred and folded exactly as ILayerNorm (``|d| <= sum|d|/2``: normalized values reach
    ``C/2`` at most)."""
    return _layernorm(a, c_len, gamma, beta, target, p, dy, c_len / L1_SIGMA, c_len / (2 * L1_SIGMA))


def _layernorm(
    a: Affine,
    c_len: int,
    gamma: np.ndarray,
    beta: np.ndarray | None,
    target: Affine | None,
    p: int,
    dy: Dyadic,
    unit: float,
    reach: float | None = None,
) -> LayerNormParams:
    """A LayerNorm whose kernel writes ``u ~ (x - mean)/sigma / unit * 2**p``: the centring (``shift_in``, a
    narrowing Requantize first if needed), gamma/beta folded into ``b/2**c ~ unit gamma/(2**p s_y)`` and
    ``bias``; the default target (int16) holds ``reach`` (the largest normalized magnitude, default
    ``unit``)."""
    gamma = np.broadcast_to(gamma.astype(np.float64).reshape(-1), (c_len,))
    beta = np.zeros(c_len) if beta is None else np.broadcast_to(beta.astype(np.float64).reshape(-1), (c_len,))
    # C * (2 * bound * 2**shift_in)**2 < 2**62  (|x - floor(mean)| <= 2 * bound)
    room = 61 - c_len.bit_length() - 2 * (2 * max(a.bound, 1)).bit_length()
    shift_in = max(0, min(room // 2, 16))
    pre = None
    if room < 0:  # too wide an input for exact variance: shift it down first (LayerNorm is scale-free)
        k = (-room + 1) // 2 + 1
        pre = Affine(a.scale * 2.0**k, 0, np.int32, bound=(a.bound >> k) + 1)
    t = target
    if t is None:
        top = float(np.max(np.abs(gamma))) * (unit if reach is None else reach) + float(np.max(np.abs(beta)))
        t = Affine(np.float64(top / 32767 if top > 0 else 1.0), 0, np.int16)
    mult = unit * gamma / (2.0**p * float(t.scale))
    # a dead channel (pretrained weights hold gamma entries like -5e-33) moves its output by less than 2**-20
    # of a step even at the largest |u| = 2**p: its multiplier is 0, the output its bias alone
    mult = np.where(np.abs(mult) * 2.0**p < 2.0**-20, 0.0, mult)
    shifted_beta = beta / float(t.scale)
    b = np.zeros(c_len, np.int64)
    c = np.zeros(c_len, np.int64)
    # |u| <= 2**p, and the bias is |beta/s_y / m| times the multiplier: each channel's multiplier width
    # leaves room for both, so 2**p |b| + |bias| + 2**(c-1) < 2**62
    with np.errstate(divide="ignore"):
        ratio = np.where(mult != 0, np.abs(shifted_beta) / np.abs(mult), np.inf)
    widths = np.array(
        [61 - ((1 << p) + math.ceil(r) + 1).bit_length() if np.isfinite(r) else 0 for r in ratio]
    )
    widths = np.minimum(widths, 31)
    for w in np.unique(widths[widths >= 8]):  # channels with |gamma| negligible next to beta keep b = 0
        sel = widths == w
        b[sel], c[sel] = dy(mult[sel], int(w), "LayerNorm gamma multiplier", allow_negative=True)
    bias = np.rint(np.ldexp(shifted_beta, c)).astype(np.int64)
    return LayerNormParams(pre, shift_in, p, b, c, bias, t)


@dataclass(frozen=True)
class L2NormParams:
    pre: Affine | None  #: a narrower type to requantize the input to first (too wide for an exact sum)
    zero_point: int  #: the input's zero point (of ``pre`` when there is one)
    shift_in: int
    eps: int
    p: int
    multiplier: np.ndarray
    shift: np.ndarray
    t: Affine


#: IL2Norm's default output type when no QuantizeLinear follows: int16 at 2**-15 (``|y| <= 1``)
L2NORM_DEFAULT_BITS = 15


def l2norm(
    a: Affine, c_len: int, eps: float, target: Affine | None, p: int, dy: Dyadic = plain_dyadic
) -> L2NormParams:
    """IL2Norm over rows of ``c_len`` of the per-tensor type ``a``: ``x / max(||x||, eps)``.

    ``shift_in`` is the widest (at most 16) with ``C * (bound * 2**shift_in)**2 < 2**62`` (a wider input is
    first requantized down by a power of two: the result is scale-free); ``eps`` in units of ``d``,
    ``max(1, ceil(eps * 2**shift_in / s))``; ``b/2**c ~ 1/(2**p s_y)`` into ``target`` (per tensor) or int16
    at ``2**-15``.
    """

    def room(bound: int) -> int:  # C * (bound * 2**s)**2 < 2**(bits(C) + 2 bits(bound) + 2 s) <= 2**62
        return 62 - c_len.bit_length() - 2 * max(bound, 1).bit_length()

    pre, zp, s, bound = None, a.zero_point, float(a.scale.reshape(-1)[0]), a.bound
    if room(bound) < 0:
        k = (-room(bound) + 1) // 2 + 1
        pre = Affine(a.scale * 2.0**k, 0, np.int32, bound=(bound >> k) + 1)
        zp, s, bound = 0, s * 2.0**k, pre.bound
    shift_in = max(0, min(room(bound) // 2, 16))
    eps_int = min(max(1, math.ceil(eps * 2.0**shift_in / s)), 2**62 - 1)
    t = target if target is not None and target.per_tensor else None
    t = t or Affine(np.float64(2.0**-L2NORM_DEFAULT_BITS), 0, np.int16)
    mult = np.asarray(1.0 / (2.0**p * float(t.scale.reshape(-1)[0])))
    b, c = dy(mult, multiplier_bits(1 << p), "L2 norm multiplier")
    return L2NormParams(pre, zp, shift_in, eps_int, p, np.asarray(b), np.asarray(c), t)


# ---- the Softmax ablation (the paper's Table 2): I-BERT's polynomial exp, FQ-ViT's Log-Int-Softmax --------

#: I-BERT's exp polynomial on (-ln2, 0]: L(p) = A (p + B)**2 + C (Kim et al. 2021, Sec. 3.4)
IBERT_A, IBERT_B, IBERT_C = 0.3585, 1.353, 0.344
#: FQ-ViT's Log-Int-Softmax levels: 2**LIS_LOG_BITS powers of two (4-bit), 0 beyond
LIS_LOG_BITS = 4


def poly_coefficients(x0: int) -> tuple[int, int]:
    """``(qb, qc)`` of I-BERT's polynomial on the grid ``s = ln2 / x0``: ``round(B/s)``,
    ``round(C/(A s**2))``."""
    steps = x0 / math.log(2)
    return int(round(IBERT_B * steps)), int(round(IBERT_C / IBERT_A * steps * steps))


@dataclass(frozen=True)
class Regrid:
    """The input's rescale before a polynomial exp, ``round_shift((q - zp) * m, c)`` (Requantize): an exact
    upscale (``c == 0``, :func:`fine_grid`), a power-of-two downscale (``m == 1``), or none (both 1 and 0)."""

    m: int
    c: int
    a: Affine  #: the type after it
    x0_real: float  #: the ln 2 grid on it


def poly_grid(a: Affine, min_x0: int) -> Regrid:
    """The ``ln 2`` grid ``x0`` of a polynomial exp, kept in ``[min_x0, 2 min_x0]`` where the input allows.

    A grid coarser than ``min_x0`` steps per ``ln 2`` is upscaled exactly like Shiftmax's input; one finer
    than ``2 min_x0`` (int32 accumulators with tiny scales) is shifted down by ``2**c``, rounding half up:
    the polynomial's ``top ~ 5.8 x0**2`` grows with the square of the grid, so a finer one would only cost
    exp shift bits ``n`` (the clamp of the smallest exps), not gain precision."""
    x0_real = math.log(2) / float(a.scale)
    if x0_real <= 2 * min_x0:
        up = fine_grid(a, x0_real, min_x0)
        return Regrid(up.m, 0, up.a, up.x0_real)
    c = math.ceil(math.log2(x0_real / (2 * min_x0)))
    t = Affine(a.scale * 2.0**c, 0, np.int32, bound=(a.bound >> c) + 1)
    return Regrid(1, c, t, x0_real / 2**c)


@dataclass(frozen=True)
class PolySoftmaxParams:
    """IBertSoftmax / LogIntSoftmax parameters (``log_bits`` is LogIntSoftmax's only)."""

    grid: Regrid
    x0: int
    qb: int
    qc: int
    n: int
    bits: int
    t: Affine  #: output type

    def attrs(self, op: str) -> dict[str, int]:
        """The node attributes of ``op`` (``IBertSoftmax`` or ``LogIntSoftmax``)."""
        extra = {"log_bits": LIS_LOG_BITS} if op == "LogIntSoftmax" else {}
        return {"x0": self.x0, "qb": self.qb, "qc": self.qc, "n": self.n, "bits": self.bits, **extra}


def poly_softmax(a: Affine, row: int, target: Affine | None, min_x0: int) -> PolySoftmaxParams:
    """A polynomial-exp softmax of a per-tensor ``a`` in rows of ``row``, written at the target's ``2**-bits``
    if it can (else 16 bits into int32, as Shiftmax)."""
    grid = poly_grid(a, min_x0)
    x0 = max(1, int(round(grid.x0_real)))
    qb, qc = poly_coefficients(x0)
    bits = _pow2_bits(target)
    if bits is None:
        bits = SOFTMAX_DEFAULT_BITS
        target = Affine(np.float64(2.0**-bits), 0, np.int32, bound=2**bits)
    return PolySoftmaxParams(grid, x0, qb, qc, max_n(qb * qb + qc, row), bits, target)


# ---- the one table of kernel choices ----------------------------------------------------------------------


@dataclass(frozen=True)
class Kernel:
    """One integer kernel of a nonlinear op: the private op it emits, the function of this module that
    computes its parameters, and the attributes the op reads from those parameters (the softmaxes' come from
    their parameters' ``attrs``)."""

    op: str
    params: Callable
    attrs: tuple[str, ...] = ()


#: ``--softmax/--gelu/--layernorm`` value -> its kernel, per op; the first is the default (I-ViT's), the rest
#: the paper's ablation (Table 2): I-BERT's polynomials, FQ-ViT's Log-Int-Softmax, Fully-8bit's L1 LayerNorm.
#: The converter's rules, its options, the torch QAT kernels and the approximation tests all read this table.
KERNELS: dict[str, dict[str, Kernel]] = {
    "softmax": {
        "shiftmax": Kernel("Shiftmax", shiftmax, ("x0", "n", "bits")),
        "ibert": Kernel("IBertSoftmax", poly_softmax),
        "lis": Kernel("LogIntSoftmax", poly_softmax),
    },
    "gelu": {
        "shiftgelu": Kernel("ShiftGELU", shiftgelu, ("x0", "n", "bits")),
        "ibert": Kernel("IBertGELU", ibert_gelu, ("clip", "coeff", "k")),
    },
    "layernorm": {
        "ilayernorm": Kernel("ILayerNorm", layernorm, ("shift_in", "p")),
        "l1": Kernel("L1LayerNorm", l1_layernorm, ("shift_in", "p")),
    },
}
#: the polynomial-exp softmax ops by ``Options.softmax`` (a view of :data:`KERNELS`)
POLY_SOFTMAX = {c: k.op for c, k in KERNELS["softmax"].items() if k.params is poly_softmax}
#: every kernel by the private op it emits
BY_OP = {k.op: k for choices in KERNELS.values() for k in choices.values()}
