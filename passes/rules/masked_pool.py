"""Masked mean pooling in integers: ``sum(x * mask) / max(sum(mask), 1)`` over the sequence axis.

The float graph (Hugging Face's mean pooling) multiplies the tokens by the 0/1 mask, sums, and divides by
the clipped token count. Its integer meaning, rule by rule:

- ``x * mask`` (a token mask, ``masked_pool.MaskedMul``): ``Where(mask, q, zero_point)``, same type;
- ``ReduceSum`` of a token mask (``MaskCount``): the count, ``ReduceSum(int32(mask))``, scale 1;
- ``ReduceSum`` of an integer tensor (``IntegerSum``): ``ReduceSum(int32(q - zp))``, the same scale, its
  bound times the axis length (int32, checked);
- ``Clip`` of an integer tensor with float bounds on its grid (``GridClip``): the same Clip on the integers;
  a mask count's lower bound between 0 and one count (sentence-transformers' ``clamp(min=1e-9)``) is 1: it
  differs from the float clip only where the count is 0, where the sum of the same mask's tokens is 0 too,
  so the mean is 0 either way (``MeanDiv`` checks the sum is masked by the same mask);
- ``Div(sum, count)``, the count an integer ``Clip`` made ``>= 1``, then a QuantizeLinear or, with none
  (the pooled embedding itself), int16 over the largest mean (``MeanDiv``): with
  ``M = s_sum / (s_count * s_y) ~ b / 2**c``, ``q_y = clip(floor((2*S*b + N*2**c) / (N*2**(c+1))) + zp_y)``,
  i.e. ``S*M/N`` rounded half up once, in int64 (floor division as ``(t - Mod(t, d)) / d``, exact for
  ``d > 0``). The dyadic ``M`` is the only approximation (relative error below ``2**-(bits-1)``);
  the rounding of the exact rational is tested against Python's fractions.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from ivit_onnx.affine import Affine, dtype_range
from ivit_onnx.dyadic import multiplier_bits

from ..pattern import Op, Rule, Var, reduce_axes
from .lowerer import Outcome
from .token_mask import lookup

_INT32_MAX = 2**31 - 1


def _axis_length(t: gs.Tensor, axes: list[int] | None, default: int) -> int:
    """The number of elements a reduction over ``axes`` adds (``default`` per unknown extent)."""
    if t.shape is None or axes is None:
        return default
    n = 1
    for ax in axes:
        d = t.shape[ax]
        n *= d if isinstance(d, int) and d > 0 else default
    return n


def _reduce(lw, x: gs.Tensor, node: gs.Node, hint: str) -> gs.Tensor:
    """``node``'s ReduceSum (same axes and keepdims) on the int32 tensor ``x``."""
    axes = np.array(reduce_axes(node), np.int64)
    attrs = {"keepdims": node.attrs.get("keepdims", 1)}
    if lw.ctx.opset < 13:  # axes became an input of ReduceSum in opset 13
        return lw.node("ReduceSum", [x], np.int32, hint, attrs={**attrs, "axes": axes.tolist()})
    return lw.node("ReduceSum", [x, lw.const(axes, "axes")], np.int32, hint, attrs=attrs)


def _int32(lw, t: gs.Tensor) -> gs.Tensor:
    return t if t.dtype == np.int32 else lw.node("Cast", [t], np.int32, "int32", attrs={"to": np.int32})


def _sum(lw, m, it: gs.Tensor, a: Affine, label: str) -> Outcome:
    """The ReduceSum ``m.root`` of zero-point-free integers ``it`` of type ``a``, in int32: same scale, the
    bound times the number of terms."""
    out = _reduce(lw, _int32(lw, it), m.root, "sum")
    n = _axis_length(m.x, reduce_axes(m.root), lw.opt.max_row)
    lw.set(m.root.outputs[0], out, Affine(a.scale, 0, np.int32, bound=a.bound * n))
    lw.__dict__.setdefault("term_bounds", {})[m.root.outputs[0].name] = int(a.bound)  # the mean's bound
    lw.ctx.count("lower_integer", label)
    return Outcome.HANDLED


class MaskedMul(Rule):
    """``x * mask`` with a token mask of values 0 (masked) and ``k > 0``: the integers where the mask is
    1, the zero point elsewhere; the scale times ``k``."""

    pattern = Op("Mul", Var("a"), Var("b"))
    label = "masked tokens"

    def check(self, lw, m):
        pairs = [(lw.get(x), lookup(lw, y)) for x, y in (m.root.inputs, m.root.inputs[::-1])]
        got = next(((g, k) for g, k in pairs if g is not None and k is not None), None)
        if got is None:
            return "not an integer tensor times a token mask"
        return None if got[1].off == 0 and got[1].on > 0 else "the token mask's values are not 0 and > 0"

    def rewrite(self, lw, m):
        x, y = m.root.inputs
        (it, a), mask = (lw.get(x), lookup(lw, y)) if lw.get(x) is not None else (lw.get(y), lookup(lw, x))
        keep = lw.node("Cast", [mask.keep], np.bool_, "keep", attrs={"to": np.bool_})
        out = lw.where(keep, it, lw.zp(a.zero_point, a.dtype, "zp"), a.dtype, "masked", shape=it.shape)
        lw.set(m.root.outputs[0], out, a.scaled(float(mask.on)))
        _masked_by(lw)[m.root.outputs[0].name] = mask.keep.name
        lw.ctx.count("lower_integer", self.label)
        return Outcome.HANDLED


class MaskCount(Rule):
    """``ReduceSum`` of a token mask of values 0 and ``k``: the number of 1s (int32), scale ``k``."""

    pattern = Op("ReduceSum", Var("x"))
    label = "mask count"

    def check(self, lw, m):
        mask = lookup(lw, m.x)
        if mask is None:
            return "input is not a token mask"
        return (
            None if mask.off == 0 and reduce_axes(m.root) is not None else "not a 0/k mask over constant axes"
        )

    def rewrite(self, lw, m):
        mask = lookup(lw, m.x)
        _masked_by(lw)[m.root.outputs[0].name] = mask.keep.name
        return _sum(lw, m, mask.keep, Affine(np.float64(mask.on), 0, np.int32, bound=1), self.label)


class IntegerSum(Rule):
    """``ReduceSum`` of an integer tensor over constant axes: an int32 sum of ``q - zp``, same scale."""

    pattern = Op("ReduceSum", Var("x"))
    label = "integer ReduceSum"

    def check(self, lw, m):
        got = lw.get(m.x)
        if got is None or reduce_axes(m.root) is None:
            return "input is not quantized, or the axes are not constant"
        if not got[1].per_tensor:
            return "per-channel input"
        n = _axis_length(m.x, reduce_axes(m.root), lw.opt.max_row)
        return None if got[1].bound * n <= _INT32_MAX else f"a sum of {n} values may overflow int32"

    def rewrite(self, lw, m):
        if m.x.name in _masked_by(lw):  # a sum of masked tokens: zero wherever the mask's count is
            _masked_by(lw)[m.root.outputs[0].name] = _masked_by(lw)[m.x.name]
        return _sum(lw, m, *lw.symmetric(*lw.get(m.x)), self.label)


def _positive(lw) -> set[str]:
    """Names of integer tensors a Clip made ``>= zero_point + 1`` (a safe divisor)."""
    return lw.__dict__.setdefault("positive_integers", set())


def _masked_by(lw) -> dict[str, str]:
    """Tensor name -> the token mask (its ``keep`` tensor) that zeroes it: masked tokens, their sums, and
    the mask's counts (where the count is 0, every such tensor of the same mask is 0)."""
    return lw.__dict__.setdefault("masked_by", {})


def _ceiled(lw) -> set[str]:
    """Names of mask counts clipped at a bound between 0 and one count (sentence-transformers' 1e-9): the
    clip made them ``>= 1``, which differs from the float clip only where the count is 0."""
    return lw.__dict__.setdefault("ceiled_counts", set())


def _grid_bounds(lw, node: gs.Node):
    """``(lo, hi)`` integer bounds (None where absent) of a float Clip on its input's grid, or a reason."""
    it, a = lw.get(node.inputs[0])
    out = []
    for i, t in enumerate(node.inputs[1:3]):
        v = lw.const_float(t) if t.name else None
        if t.name and (v is None or v.size != 1):
            return f"bound '{t.name}' is not a scalar constant"
        q = None if v is None else float(v.reshape(())) / float(a.scale) + a.zero_point
        count = i == 0 and node.inputs[0].name in _masked_by(lw) and a.zero_point == 0
        if q is not None and count and 0 < q < 1:  # a mask count's clamp away from 0: at least 1
            q = 1
        if q is not None and q != round(q):
            return f"bound {float(v.reshape(()))} is not on the input's integer grid"
        out.append(None if q is None else int(round(q)))
    return out + [None] * (2 - len(out))


class GridClip(Rule):
    """``Clip`` of an integer tensor whose float bounds are exact grid points: the same Clip on integers."""

    pattern = Op("Clip", Var("x"))
    label = "integer Clip"

    def check(self, lw, m):
        got = lw.get(m.x)
        if got is None or not got[1].per_tensor or len(m.root.inputs) < 2:
            return "input is not quantized per tensor, or no bounds"
        why = _grid_bounds(lw, m.root)
        return why if isinstance(why, str) else None

    def rewrite(self, lw, m):
        it, a = lw.get(m.x)
        lo, hi = _grid_bounds(lw, m.root)
        qlo, qhi = dtype_range(a.dtype)
        lo, hi = max(qlo, lo if lo is not None else qlo), min(qhi, hi if hi is not None else qhi)
        out = lw.node("Clip", [it, lw.zp(lo, a.dtype, "min"), lw.zp(hi, a.dtype, "max")], a.dtype, "clip")
        bound = min(a.bound, max(abs(lo - a.zero_point), abs(hi - a.zero_point)))
        bound = max(bound, abs(lo - a.zero_point) if lo > a.zero_point else 0)
        lw.set(m.root.outputs[0], out, Affine(a.scale, a.zero_point, a.dtype, bound=max(bound, 1)))
        if lo - a.zero_point >= 1:
            _positive(lw).add(m.root.outputs[0].name)
        if m.x.name in _masked_by(lw):
            _masked_by(lw)[m.root.outputs[0].name] = _masked_by(lw)[m.x.name]
            low = m.root.inputs[1] if len(m.root.inputs) > 1 and m.root.inputs[1].name else None
            bound = lw.const_float(low) if low is not None else None
            if bound is not None and float(bound.reshape(())) < float(a.scale):
                _ceiled(lw).add(m.root.outputs[0].name)
        lw.ctx.count("lower_integer", self.label)
        return Outcome.HANDLED


def _mean_params(lw, m):
    """``(b, c, sum type, count type, target)`` of the rounded division, or the reason it declines."""
    got_s, got_n = lw.get(m.s), lw.get(m.n)
    if got_s is None or got_n is None:
        return "sum or count is not quantized"
    (_, s), (_, n) = got_s, got_n
    if s.zero_point or n.zero_point or not (s.per_tensor and n.per_tensor):
        return "sum and count must be per-tensor integers with zero point 0"
    # no QuantizeLinear after it (sentence-transformers' pooled output, or its L2 normalization): int16 over
    # the largest mean, the largest term (|sum| <= count * term), so nothing saturates
    term = lw.__dict__.get("term_bounds", {}).get(m.s.name, s.bound)
    t = lw.target(m.root.outputs[0]) or Affine(
        np.float64(float(s.scale) * max(term, 1) / (float(n.scale) * 32767)), 0, np.dtype(np.int16)
    )
    if not t.per_tensor:
        return "sum and count must be per-tensor integers with zero point 0"
    if m.n.name not in _positive(lw):
        return "the divisor is not an integer clipped to at least 1"
    if m.n.name in _ceiled(lw) and _masked_by(lw).get(m.s.name) != _masked_by(lw)[m.n.name]:
        return "the count is clipped below 1 and the sum is not masked by the same mask (0 / 1e-9 differs)"
    ratio = float(s.scale) / (float(n.scale) * float(t.scale))
    b, c = lw.dyadic(np.float64(ratio), multiplier_bits(2 * s.bound + 1), "masked mean multiplier")
    b, c = int(np.asarray(b).reshape(())), int(np.asarray(c).reshape(()))
    if n.bound.bit_length() + c + 2 > 62:
        return f"count bound {n.bound} with shift {c} overflows int64"
    if s.bound * ratio + 1 + abs(t.zero_point) > _INT32_MAX:
        return "the mean does not fit int32 before its clip"
    return b, c, t


class MeanDiv(Rule):
    """``Div(sum, count)`` (``count`` an integer Clip made >= 1) then a QuantizeLinear: ``sum * M / count``
    rounded half up once (int64, exact floor division), ``M = b / 2**c`` the one dyadic rescale."""

    pattern = Op("Div", Var("s"), Var("n"))
    label = "masked mean (integer division)"

    def check(self, lw, m):
        got = _mean_params(lw, m)
        return got if isinstance(got, str) else None

    def rewrite(self, lw, m):
        b, c, t = _mean_params(lw, m)
        s64 = lw.node("Cast", [lw.get(m.s)[0]], np.int64, "sum64", attrs={"to": np.int64})
        n64 = lw.node("Cast", [lw.get(m.n)[0]], np.int64, "count64", attrs={"to": np.int64})
        num = lw.node(
            "Add",
            [
                lw.node("Mul", [s64, lw.const(np.int64(2 * b), "2b")], np.int64, "scaled"),
                lw.node("Mul", [n64, lw.const(np.int64(2**c), "half")], np.int64, "half_den"),
            ],
            np.int64,
            "num",
        )
        den = lw.node("Mul", [n64, lw.const(np.int64(2 ** (c + 1)), "den_k")], np.int64, "den")
        rem = lw.node("Mod", [num, den], np.int64, "rem", attrs={"fmod": 0})
        q = lw.node("Div", [lw.node("Sub", [num, rem], np.int64, "exact"), den], np.int64, "floor_div")
        q = lw.node("Add", [_int32(lw, q), lw.const(np.int32(t.zero_point), "y_zp")], np.int32, "shifted")
        lo, hi = dtype_range(t.dtype)
        q = lw.node(
            "Clip", [q, lw.const(np.int32(lo), "qmin"), lw.const(np.int32(hi), "qmax")], np.int32, "sat"
        )
        out = q if t.dtype == np.int32 else lw.node("Cast", [q], t.dtype, "out", attrs={"to": t.dtype.type})
        lw.set(m.root.outputs[0], out, t)
        lw.ctx.count("lower_integer", self.label)
        return Outcome.HANDLED


RULES = (MaskedMul(), MaskCount(), IntegerSum(), GridClip(), MeanDiv())
