"""Attention masks before Softmax, in integers: masked scores get a fill value Shiftmax maps to exactly 0.

``masked_scores`` is the reusable piece (Swin's constant shifted-window mask here, BERT's int64 mask
input elsewhere): scores ``x`` (symmetric, int32) become ``Where(masked, fill, x)`` with

    fill = -(bound + ceil(30 * LOG2E_FIX / s) + 18)

for scores of scale ``s`` and ``|x| <= bound``. Whatever upscale ``m``, grid ``x0`` and ``n <= 30`` the
Shiftmax rule then picks, a masked entry lies at least ``n*x0 + 3`` below the row maximum (an unmasked
entry, as long as a row keeps one), so its shift-exp hits the clamp and equals ``x0``, and
``int_div(x0, sum, bits) = 0`` because ``sum >= x0 * 2**n`` and ``n >= bits`` (checked here). The same
fill serves the polynomial-exp kernels of ``--softmax ibert|lis`` (their exp clamps at ``n*x0 <= 30 ln2/s``
plus rounding, closer than Shiftmax's; :func:`zero_reason` checks each kernel's conditions). The proofs are
written out in opset/README.md ("Masked scores").

``MaskedAdd`` lowers ``Softmax(reshapes(Add(scores, C)))`` with a constant ``C`` of zeros and mask values
``<= -T``, ``T = 2 R + (bits + 1) ln 2`` (``R`` the scores' real bound): there the float model's
probability ``e**(C + 2R)`` is below half the output step, so the fake-quant model has exactly 0 too.
"""

from __future__ import annotations

import math

import numpy as np
import onnx_graphsurgeon as gs

from ivit_onnx import qparams
from ivit_onnx.affine import Affine
from ivit_onnx.graph import const_array
from ivit_onnx.opset import log_int_softmax as lis

from ..pattern import Op, Rule
from .consts import constant_value
from .lowerer import Lowerer, Outcome

#: the cap of ``shift_exp.max_n``: the largest ``n`` a Shiftmax gets, which the fill's margin covers
N_CAP = 30
#: layout ops that keep rows (the last axis) intact between the masking Add and its Softmax
ROW_KEEPING = ("Reshape", "Unsqueeze", "Squeeze", "Identity", "Flatten")
_INT32_MAX = 2**31 - 1


class MaskError(ValueError):
    """The scores cannot be masked exactly (too wide a bound, or a Shiftmax with ``n < bits``)."""


def softmax_row(lw: Lowerer, softmax: gs.Node) -> int:
    """The row length the Softmax rule sizes its Shiftmax for (its static last dim, else ``max_row``)."""
    shape = softmax.inputs[0].shape
    last = shape[-1] if shape else None
    return int(last) if isinstance(last, int) else lw.opt.max_row


def zero_reason(
    t: Affine, gap: int, row: int, target: Affine | None, min_x0: int, softmax: str
) -> tuple[int, str | None]:
    """``(bits, None)`` when the kernel ``softmax`` (``Options.softmax``), with the parameters the Softmax
    rule derives from the type ``t`` it reads, writes exactly 0 for every entry ``gap`` or more (in ``t``'s
    integers) below the row's unmasked maximum; else ``(bits, why not)``. The conditions of the proofs in
    opset/README.md ("Masked scores"): the exp reaches its clamp there, and the clamped exp's share is 0."""
    if softmax == "shiftmax":
        sp = qparams.shiftmax(t, row, target, min_x0)
        if sp.bits <= sp.n <= N_CAP and gap * sp.up.m >= sp.n * sp.x0 + 3:
            return sp.bits, None
        return sp.bits, f"Shiftmax n={sp.n}, x0={sp.x0}, bits={sp.bits} cannot give masked entries 0"
    op = qparams.POLY_SOFTMAX[softmax]
    pp = qparams.poly_softmax(t, row, target, min_x0)
    # IBertSoftmax: a clamped exp is about 2**-n of the maximum's, 0 once n >= bits + 1 (after the shift by
    # k); LogIntSoftmax: past every one of its K thresholds once n >= K. The grid's rescale moves a gap g to
    # at most g m / 2**c + 1 below.
    need = lis.levels(pp.bits, qparams.LIS_LOG_BITS) if op == "LogIntSoftmax" else pp.bits + 1
    if need <= pp.n and gap * pp.grid.m >= (pp.n * pp.x0 + 1) << pp.grid.c:
        return pp.bits, None
    return pp.bits, f"{op} n={pp.n}, x0={pp.x0}, bits={pp.bits} cannot give masked entries 0"


def fill_type(
    a: Affine, row: int, target: Affine | None, min_x0: int, softmax: str = "shiftmax"
) -> tuple[int, Affine, int]:
    """``(fill, type of the masked scores, softmax bits)`` for symmetric per-tensor scores ``a`` before the
    Softmax kernel ``softmax``."""
    margin = math.ceil(N_CAP * qparams.LOG2E_FIX / float(a.scale)) + 18
    fill = -(a.bound + margin)
    if -fill > _INT32_MAX:
        raise MaskError(f"scores bound {a.bound} at scale {float(a.scale):.3g} leaves no int32 room to mask")
    t = Affine(a.scale, 0, np.int32, bound=-fill)
    bits, why = zero_reason(t, margin, row, target, min_x0, softmax)
    if why:
        raise MaskError(why)
    return fill, t, bits


def softmax_context(lw: Lowerer, softmax: gs.Node) -> tuple:
    """``(row, target, min_x0, kernel)``: what the Softmax rule will derive ``softmax``'s parameters from
    besides its input type (:func:`fill_type`'s and :func:`zero_reason`'s last arguments)."""
    return softmax_row(lw, softmax), lw.target(softmax.outputs[0]), lw.opt.min_x0, lw.opt.softmax


def masked_scores(
    lw: Lowerer, it: gs.Tensor, a: Affine, masked: gs.Tensor, softmax: gs.Node
) -> tuple[gs.Tensor, Affine]:
    """``Where(masked, fill, scores)`` in int32: the Shiftmax of ``softmax`` gives exactly 0 where
    ``masked`` (a bool tensor broadcasting against the scores) is true, if every row keeps one false."""
    it, a = lw.symmetric(*lw.per_tensor(it, a))
    fill, t, _ = fill_type(a, *softmax_context(lw, softmax))
    if a.dtype != t.dtype:
        it = lw.node("Cast", [it], np.int32, "widen", attrs={"to": np.int32}, shape=it.shape)
    out = lw.node("Where", [masked, lw.const(np.array(fill, np.int32), "fill"), it], np.int32, "mask")
    lw.ctx.count("lower_integer", "attention mask (Where)")
    return out, t


def _lowered_value(lw: Lowerer, t: gs.Tensor) -> np.ndarray | None:
    """The real value of a constant, also one the lowerer already moved through layout ops."""
    v = lw.const_float(t)
    if v is not None or lw.get(t) is None:
        return v
    it, a = lw.get(t)
    q = constant_value(it, lw.ctx.opset)
    return None if q is None else (q.astype(np.float64) - a.zero_point) * a.scale


def softmax_after(t: gs.Tensor) -> gs.Node | None:
    """The last-axis Softmax that ``t`` reaches through row-keeping reshapes only (rows stay rows)."""
    last, start = (t.shape[-1] if t.shape else None), t
    while len(t.outputs) == 1:
        node = t.outputs[0]
        if node.op == "Softmax":
            axis, rank = node.attrs.get("axis", -1), len(t.shape or ())
            ok = axis == -1 or (rank and axis == rank - 1)
            same_rows = t is start or isinstance(last, int) and (t.shape or [None])[-1] == last  # #11-BERT
            return node if ok and same_rows else None
        if node.op not in ROW_KEEPING:
            return None
        t = node.outputs[0]
    return None


class MaskedAdd(Rule):
    """``Add(scores, C)`` of a constant mask ``C`` (0 or ``<= -T``) feeding a Softmax → integer Where; it
    declines any other Add, which the generic Add rule after it in ``RULES`` (``chain.ahead``) lowers."""

    pattern = Op("Add")
    label = "attention mask (Where)"

    @staticmethod
    def _parts(lw: Lowerer, node: gs.Node):
        x, y = node.inputs
        for s, c in ((x, y), (y, x)):
            cv = _lowered_value(lw, c) if lw.get(s) is not None else None
            if cv is not None and np.issubdtype(cv.dtype, np.floating):
                return s, cv
        return None, None

    def check(self, lw: Lowerer, m) -> str | None:
        node = m.root
        scores, c = self._parts(lw, node)
        if scores is None:
            return "not integer scores plus a constant"
        if quantized_sum(lw, node.outputs[0]) is not None:
            return _quantized_plan(lw, node, scores, c)[1]
        softmax = softmax_after(node.outputs[0])
        if softmax is None:
            return "the sum does not reach a last-axis Softmax through reshapes"
        it, a = lw.get(scores)
        a = Affine(a.scale, 0, np.int32, bound=a.bound) if a.per_tensor else qparams.per_tensor(a)
        try:
            _, _, bits = fill_type(a, *softmax_context(lw, softmax))
        except MaskError as e:
            return str(e)
        return _mask_reason(c, threshold(a, bits), node.outputs[0].shape)

    def rewrite(self, lw: Lowerer, m) -> Outcome:
        node = m.root
        scores, c = self._parts(lw, node)
        if quantized_sum(lw, node.outputs[0]) is not None:
            (t, fill, masked), _ = _quantized_plan(lw, node, scores, c)
            y = lw.requantize(*lw.per_tensor(*lw.get(scores)), t, "mask_sum")  # the unmasked entries: S + 0
            out = lw.where(lw.const(masked, "masked"), lw.zp(fill, t.dtype, "fill"), y, t.dtype, "mask",
                           shape=node.outputs[0].shape)
            lw.set(node.outputs[0], out, t)
            lw.ctx.count("lower_integer", self.label)
            return Outcome.HANDLED
        softmax = softmax_after(node.outputs[0])
        it, a = lw.get(scores)
        sym = Affine(a.scale, 0, np.int32, bound=a.bound) if a.per_tensor else qparams.per_tensor(a)
        _, _, bits = fill_type(sym, *softmax_context(lw, softmax))
        masked = lw.const(c <= -threshold(sym, bits), "masked")
        out, t = masked_scores(lw, it, a, masked, softmax)
        out.shape = node.outputs[0].shape
        lw.set(node.outputs[0], out, t)
        return Outcome.HANDLED


def _qdq_params(q: gs.Node) -> list | None:
    """The scale and zero point of a QuantizeLinear/DequantizeLinear (constants), or None."""
    v = [const_array(x) if x.name else None for x in q.inputs[1:3]]
    return None if any(x is None for x in v) or len(v) < 2 else v


def _same_pair(q: gs.Node, params: list) -> gs.Node | None:
    """The DequantizeLinear after ``q`` when ``q`` → DQ round-trips with ``params`` (an integer no-op)."""
    if q.op != "QuantizeLinear" or len(q.outputs[0].outputs) != 1:
        return None
    dq = q.outputs[0].outputs[0]
    if dq.op != "DequantizeLinear":
        return None
    same = [_qdq_params(n) for n in (q, dq)]
    ok = all(
        v is not None and all(np.array_equal(a, b) for a, b in zip(v, params, strict=True)) for v in same
    )
    return dq if ok else None


def quantized_sum(lw: Lowerer, t: gs.Tensor) -> tuple[Affine, gs.Node] | None:
    """``(type, Softmax)`` when the masked sum ``t`` is quantized first (QuantizeLinear → DequantizeLinear,
    one per-tensor type, as onnxruntime's quantizer places them; more such pairs of that type after its
    reshapes) and then reaches a last-axis Softmax through reshapes."""
    q = t.outputs[0] if len(t.outputs) == 1 else None
    params = _qdq_params(q) if q is not None and q.op == "QuantizeLinear" else None
    dq = _same_pair(q, params) if params is not None else None
    if dq is None:
        return None
    t_q, x, last = lw.q_type(q, t), dq.outputs[0], (t.shape or [None])[-1]
    while len(x.outputs) == 1:
        node = x.outputs[0]
        if node.op == "Softmax":
            axis, rank = node.attrs.get("axis", -1), len(x.shape or ())
            rows = isinstance(last, int) and (x.shape or [None])[-1] == last
            ok = (axis == -1 or (rank and axis == rank - 1)) and rows and t_q.per_tensor
            return (t_q, node) if ok else None
        pair = _same_pair(node, params)
        if node.op not in ROW_KEEPING and pair is None:
            return None
        x = (pair or node).outputs[0]
    return None


def _quantized_plan(lw: Lowerer, node: gs.Node, scores: gs.Tensor, c: np.ndarray):
    """``((type, fill, masked), None)`` for a mask whose sum is quantized before the Softmax, or
    ``(None, reason)``. The Where acts on the sum's own integers (``fill`` in its dtype), and the proof of the
    masked Shiftmax uses the type the Softmax rule will read (the DequantizeLinear's, per tensor)."""
    t, softmax = quantized_sum(lw, node.outputs[0])
    _, a = lw.per_tensor(*lw.get(scores))
    s = float(t.scale)
    unmasked = math.ceil(a.bound * float(a.scale) / s) + 1  # |S/s - zp| of an unmasked entry, requantized
    margin = math.ceil(N_CAP * qparams.LOG2E_FIX / s) + 18
    fill = t.zero_point - unmasked - margin
    if fill < t.qrange[0]:
        return None, f"the sum's type {t.describe()} has no room below the scores for a mask fill"
    bits, why = zero_reason(Affine(t.scale, t.zero_point, t.dtype), margin, *softmax_context(lw, softmax))
    if why:
        return None, why
    # the fake-quant model's masked logit is at most max(R + C, (qmin - zp) s) (+ s/2 rounding), its
    # unmasked maximum at least -R - s/2: both must be (bits + 1) ln 2 apart for it to output 0 there too
    limit = threshold(a, bits) + s
    if (t.qrange[0] - t.zero_point) * s + float(a.bound * a.scale) + s > -(bits + 1) * math.log(2):
        return None, f"the sum's type {t.describe()} clamps masked entries too close to the scores"
    why = _mask_reason(c, limit, node.outputs[0].shape)
    return ((t, fill, np.asarray(c <= -limit)), None) if why is None else (None, why)


def threshold(a: Affine, bits: int) -> float:
    """``T = 2 R + (bits + 1) ln 2``: an entry ``C <= -T`` has float probability below half an output step."""
    return 2 * a.bound * float(a.scale) + (bits + 1) * math.log(2)


def _mask_reason(c: np.ndarray, limit: float, out_shape) -> str | None:
    """None when ``c`` is a mask: zeros and values ``<= -threshold``, some of them, and none of its rows
    (the last axis, broadcast to the scores) masked entirely; else why not."""
    masked = c <= -limit
    if not masked.any():
        return f"no entry at or below -{limit:.3g} (not a mask)"
    if not np.all(masked | (c == 0)):
        return f"constant values in (-{limit:.3g}, 0) or above 0: neither masked nor unmasked"
    last = out_shape[-1] if out_shape else None
    if masked.shape[-1] == 1 and last != 1:
        return "mask broadcast along the softmax axis would mask whole rows"
    if np.any(masked.all(axis=-1)):
        return "a row is masked entirely (its probabilities would not be 0)"
    return None
