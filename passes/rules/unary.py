"""Relu / Neg / Abs / LeakyRelu / float Clip of a quantized tensor: exact integer ops, or an exact table.

On an 8- or 16-bit per-tensor input the fake-quant values ``Q(f(DQ(q)))`` over every ``q`` are computed as
the table lookups compute them (:func:`.lookup.table_of`); where that table is ``clip(m (q - zx) + zy, lo,
hi)`` with ``m = ±1`` (Relu and Clip into the input's type, Neg into the mirrored one) it is one exact
Requantize (``b = m``, ``c = 0``, ``qmin = lo``, ``qmax = hi``), else the table itself (``Gather``): equal to
the fake-quant model either way, checked on every input. With no QuantizeLinear after it the output keeps the
input's scale exactly: Relu and Clip the input's type (a float Clip's bounds rounded onto its grid, half to
even, as a QuantizeLinear of that type would), Neg the mirrored zero point ``qmin + qmax - zx`` (``-1 - q``
on int8: -128 ↔ 127, no widening), Abs ``|q - zx|`` in int32, LeakyRelu with ``alpha = m / 2**k`` (float32:
always dyadic) ``m (q - zx) + (2**k - m) relu(q - zx)`` in int32 at scale ``s / 2**k`` where that fits.

A wider input (an int32 accumulator) or a per-channel one takes integer ops: Relu and Clip are one Requantize
into the target with ``qmin``/``qmax`` at ``Q(0)`` / ``Q(lo)``, ``Q(hi)`` (``Q`` is monotone, so
``Q(clip(x)) = clip(Q(x))``), Neg one Requantize with a negative multiplier, Abs ``|q - zx|`` and LeakyRelu
the int32 form above, then a Requantize; each within the one output step of any requantize (ties, the dyadic
multiplier)."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import onnx_graphsurgeon as gs

from ivit_onnx import qparams
from ivit_onnx.affine import Affine, dtype_range
from ivit_onnx.graph import dequantized_const
from ivit_onnx.io import quantize

from ..pattern import Op, Rule
from . import lookup
from .lowerer import Lowerer, Outcome, optional_input

_I32 = np.dtype(np.int32)


def _clamp(
    lw: Lowerer, it, a: Affine, b, c, t: Affine, lo: int, hi: int, hint: str
) -> tuple[gs.Tensor, Affine]:
    """``clip(round_shift((q - zx) b, c) + zy, lo, hi)``: one Requantize into ``t``'s type narrowed to
    ``[lo, hi]``."""
    inputs = [it, lw.zp(a.zero_point, a.dtype, "x_zp"), lw.const(np.asarray(b, np.int64), "mult"),
              lw.const(np.asarray(c, np.int64), "shift"), lw.zp(t.zero_point, t.dtype, "y_zp")]  # fmt: skip
    shape = it.shape if isinstance(it, gs.Variable) else None
    out = lw.private("Requantize", inputs, t.dtype, hint, shape=shape, qmin=lo, qmax=hi)
    return out, Affine(
        t.scale, t.zero_point, t.dtype, bound=max(abs(lo - t.zero_point), abs(hi - t.zero_point))
    )


def _affine_form(q: np.ndarray, table: np.ndarray, a: Affine, t: Affine) -> tuple[int, int, int] | None:
    """``(m, lo, hi)`` when ``table == clip(m (q - zx) + zy, lo, hi)`` with ``m = ±1`` on every ``q``."""
    y = table.astype(np.int64)
    lo, hi = int(y.min()), int(y.max())
    for m in (1, -1):
        if np.array_equal(y, np.clip(m * (q - a.zero_point) + t.zero_point, lo, hi)):
            return m, lo, hi
    return None


def _bounds(node: gs.Node) -> tuple[float | None, float | None]:
    """A Clip's constant float bounds (None where absent)."""
    ends = []
    for i in (1, 2):
        t = optional_input(node, i)
        v = dequantized_const(t) if t is not None else None
        if t is not None and (v is None or v.size != 1 or v.dtype.kind != "f"):
            raise ValueError(f"bound '{t.name}' is not a float constant scalar")
        ends.append(None if v is None else float(v.reshape(())))
    return ends[0], ends[1]


def _own(node: gs.Node, a: Affine) -> Affine:
    """The output type with no QuantizeLinear after an 8/16-bit input: the input's scale, exactly."""
    if node.op == "Neg":  # q -> qmin + qmax - q, in range for every q
        lo, hi = a.qrange
        return Affine(a.scale, lo + hi - a.zero_point, a.dtype, a.bound)
    return a


def _slope(node: gs.Node) -> tuple[int, int]:
    """LeakyRelu's float32 ``alpha`` as ``m / 2**k`` exactly (every float is dyadic)."""
    f = Fraction(float(np.float32(node.attrs.get("alpha", 0.01))))
    return f.numerator, f.denominator.bit_length() - 1


def _leaky_bound(node: gs.Node, a: Affine) -> int:
    """The bound of ``2**k LeakyRelu(q - zx) = m (q - zx) + (2**k - m) relu(q - zx)``."""
    m, k = _slope(node)
    return a.bound * (abs(m) + abs((1 << k) - m))


class PiecewiseLinear(Rule):
    """Relu / Neg / Abs / LeakyRelu → an exact Requantize clamp, a table, or integer ops."""

    pattern = Op(("Relu", "Neg", "Abs", "LeakyRelu"))
    label = "integer clamp (Requantize)"

    def check(self, lw: Lowerer, m) -> str | None:
        node = m.root
        why = lw.missing(node.inputs[0])
        if why is None and node.op == "Clip":
            try:
                _bounds(node)
            except ValueError as e:
                return str(e)
        if why is None and node.op == "LeakyRelu" and not lookup.tabulable(lw, node.inputs[0]):
            a = lw.get(node.inputs[0])[1]
            if _leaky_bound(node, a) > qparams.INT32_MAX:
                mult, k = _slope(node)
                return (
                    f"input '{node.inputs[0].name}' is {a.describe()} and alpha = {mult}/2**{k}: "
                    "2**k LeakyRelu(x) may exceed int32 (quantize its input to 8 or 16 bits)"
                )
        return why

    def rewrite(self, lw: Lowerer, m) -> Outcome:
        node = m.root
        it, a = lw.get(node.inputs[0])
        t = lw.target(node.outputs[0])
        if lookup.tabulable(lw, node.inputs[0]) and (t is None or t.per_tensor):
            out = self._exact(lw, node, it, a, t)
        else:
            out = self._wide(lw, node, it, a, t)
        if out is not None:
            lw.set(node.outputs[0], *out[:2])
            lw.ctx.count("lower_integer", f"{node.op} → {out[2] if len(out) > 2 else self.label}")
        return Outcome.HANDLED

    def _exact(self, lw: Lowerer, node: gs.Node, it, a: Affine, t: Affine | None):
        """8/16-bit per tensor: the fake-quant table, as one Requantize where it is an affine clamp."""
        if t is None and node.op == "Abs":
            return self._abs(lw, it, a, None)
        if t is None and node.op == "LeakyRelu" and _leaky_bound(node, a) <= qparams.INT32_MAX:
            return self._leaky(lw, node, it, a, None)
        own = _own(node, a)
        q, y = lookup.fake_quant(lw, node, a, t)
        if t is None:  # exact on the grid (Relu, Neg); a Clip's bounds rounded onto it
            y = quantize(y, np.asarray(own.scale, np.float32), np.asarray(own.zero_point, own.dtype), 0)
        t = t or own
        form = _affine_form(q, y, a, t)
        if form is None:
            lookup.gather(lw, node, it, a, y, t, lookup.TableLookup.label)
            return None
        mult, lo, hi = form
        return _clamp(lw, it, a, mult, 0, t, lo, hi, node.op.lower())

    def _wide(self, lw: Lowerer, node: gs.Node, it, a: Affine, t: Affine | None):
        """int32 or per-channel input: integer ops, requantized into the target."""
        if node.op == "Abs":
            return self._abs(lw, it, a, t)
        if node.op == "LeakyRelu":
            return self._leaky(lw, node, it, a, t)
        if node.op == "Clip" and t is None:  # the bounds on the input's grid: one scale
            it, a = lw.per_tensor(it, a)
        sign = -1 if node.op == "Neg" else 1
        if t is None:
            lo, hi = a.qrange
            t = Affine(a.scale, (lo + hi - a.zero_point) if sign < 0 and a.dtype != _I32 else a.zero_point,
                       a.dtype, a.bound)  # fmt: skip
            b, c = np.int64(sign), np.int64(0)
        else:
            b, c = qparams.requantize(a, t, lambda r, bits, what: lw.dyadic(sign * r, bits, what, sign < 0))
        lo, hi = t.qrange
        if a.dtype == _I32 and t.dtype == _I32:
            lo = -hi  # -q of int32 saturates at -(2**31 - 1), not past it
        if node.op == "Relu":
            lo = max(lo, t.zero_point)
        elif node.op == "Clip":
            if not t.per_tensor:
                raise ValueError(
                    "a per-channel QuantizeLinear after a float Clip (its bounds differ per channel)"
                )
            scale, zp = np.asarray(t.scale, np.float32), np.asarray(t.zero_point, t.dtype)
            ends = [
                int(quantize(np.float32(v), scale, zp, 0)) if v is not None else None for v in _bounds(node)
            ]
            lo, hi = (
                max(lo, ends[0]) if ends[0] is not None else lo,
                min(hi, ends[1]) if ends[1] is not None else hi,
            )
            if lo > hi:
                raise ValueError("Clip's bounds are empty on the output's grid")
        return _clamp(lw, it, a, b, c, t, lo, hi, node.op.lower())

    def _abs(self, lw: Lowerer, it, a: Affine, t: Affine | None):
        """``|q - zx|`` in int32 (Abs), requantized into ``t`` when there is one."""
        c32 = Affine(a.scale, 0, np.int32, a.bound)
        if a.dtype != _I32 or a.zero_point:
            ones = np.ones(a.scale.shape, np.int64)
            it, _ = _clamp(lw, it, a, ones, ones * 0, c32, *dtype_range(np.int32), "center")
        it = lw.node("Abs", [it], np.int32, "abs", shape=it.shape)
        if t is None:
            return it, c32, "integer Abs"
        return lw.requantize(it, c32, t), t, "integer Abs"

    def _leaky(self, lw: Lowerer, node: gs.Node, it, a: Affine, t: Affine | None):
        """``2**k LeakyRelu = m (q - zx) + (2**k - m) relu(q - zx)`` in int32 at scale ``s / 2**k`` (exact:
        two Requantizes with shift 0, the second clamped at 0, and an Add), requantized into ``t``."""
        m, k = _slope(node)
        s32 = Affine(a.scale / (1 << k), 0, np.int32, bound=_leaky_bound(node, a))
        top = qparams.INT32_MAX
        y, _ = _clamp(lw, it, a, np.int64(m), np.int64(0), s32, -top, top, "slope")
        rest = (1 << k) - m
        if rest:
            lo, hi = (0, top) if rest > 0 else (-top, 0)
            r, _ = _clamp(lw, it, a, np.int64(rest), np.int64(0), s32, lo, hi, "positive_part")
            y = lw.node("Add", [y, r], np.int32, "leaky", shape=it.shape)
        label = "integer LeakyRelu (dyadic slope)"
        return (y, s32, label) if t is None else (lw.requantize(y, s32, t), t, label)


class FloatClip(PiecewiseLinear):
    """A float Clip with constant bounds (after QCDQ's integer Clip, ``qdq.Clip``, declines) → an exact
    Requantize clamp at the bounds on the output's grid."""

    pattern = Op("Clip")
