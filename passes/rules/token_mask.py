"""Token masks: float tensors computed from a 0/1 integer graph input (BERT's ``attention_mask``).

An encoder turns its int64 mask into float arithmetic, ``(1 - float(mask)) * -10000`` or
``Where(bool(mask), 0, finfo.min)``. Such a tensor takes only two values, one where the mask is 1 and
one where it is 0, so it needs no scale: these rules carry it as a :class:`TwoValued` (the integer mask,
laid out like the float tensor, and the two float values, computed here in float32 as the float graph
computes them) and emit only the layout ops on the integer mask. The float nodes stay in place and are
dropped when nothing float reads them; the consumers that turn a two-valued mask into integers are the
attention mask (:class:`TokenMaskedAdd`, :class:`TokenMaskedWhere`, through ``mask.masked_scores``) and the
masked mean pooling (``masked_pool.py``).
Precondition (Hugging Face's convention): every mask entry is 0 or 1.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

from ivit_onnx import qparams
from ivit_onnx.affine import Affine
from ivit_onnx.graph import dequantized_const, producer

from ..pattern import Op, Rule, Var
from .lowerer import Outcome
from .mask import MaskError, fill_type, masked_scores, softmax_after, softmax_context, threshold

#: layout ops applied to the integer mask as they are (their other inputs are shapes/axes/indices; a gather
#: of a 0/1 mask is 0/1: Hugging Face's masks index the padding mask with computed, folded indices)
LAYOUT = ("Unsqueeze", "Squeeze", "Reshape", "Expand", "Slice", "Transpose", "Identity", "Flatten", "Gather",
          "GatherND")
_ARITH = ("Add", "Sub", "Mul", "Div")
#: graph input types taken for a 0/1 mask (int8/uint8 inputs are quantized data, not masks)
_MASK_DTYPES = (np.dtype(np.int64), np.dtype(np.int32), np.dtype(np.bool_))


@dataclass(frozen=True)
class TwoValued:
    """A float (or bool) tensor equal to ``on`` where ``keep`` is 1 and ``off`` where it is 0."""

    keep: gs.Tensor  #: the integer 0/1 mask, shaped (broadcastably) like the float tensor
    on: np.float32
    off: np.float32


def _table(lw) -> dict[str, TwoValued]:
    return lw.__dict__.setdefault("token_masks", {})


def lookup(lw, t: gs.Tensor) -> TwoValued | None:
    """The two-valued description of float tensor ``t``, if these rules derived one."""
    return _table(lw).get(t.name)


def _record(lw, t: gs.Tensor, value: TwoValued) -> Outcome:
    _table(lw)[t.name] = value
    lw.ctx.count("lower_integer", "token mask (two-valued)")
    return Outcome.KEPT  # the float node stays; cleanup drops it unless a float island still reads it


def _from_graph_input(lw, t: gs.Tensor, depth: int = 0) -> bool:
    """``t`` is an integer graph input, layout ops of one, or the product (``Mul``, ``And``) of two such
    (DeBERTa-v2's query-by-key mask ``m[:, None, :, None] * m[:, None, None, :]``: 0/1 too); the only sources
    taken for a 0/1 mask."""
    while t not in lw.g.inputs:
        p = producer(t)
        if p is not None and p.op in ("Mul", "And") and depth < 8:
            return all(_from_graph_input(lw, x, depth + 1) for x in p.inputs[:2])
        if p is None or p.op not in LAYOUT:
            return False
        t = p.inputs[0]
    return t.dtype is not None and np.dtype(t.dtype) in _MASK_DTYPES


def _cast(value, to_dtype) -> np.float32:
    """``value`` cast as ONNX Cast does to ``to_dtype`` (bool: non-zero), held as float32."""
    dt = np.dtype(to_dtype)
    return np.float32(bool(value)) if dt == np.bool_ else np.float32(np.asarray(value, np.float32).astype(dt))


def _scalar(lw, t: gs.Tensor) -> np.float32 | None:
    """A scalar float (or bool) constant's value, also one behind a (lowered) DequantizeLinear."""
    v = lw.const_float(t) if lw.get(t) is not None else dequantized_const(t)
    return np.float32(v.reshape(())) if v is not None and v.size == 1 and v.dtype.kind in "fb" else None


class MaskCast(Rule):
    """Cast of an integer graph input (through layout ops) to float or bool starts a token mask; a Cast of
    a token mask casts its two values."""

    pattern = Op("Cast", Var("x"))
    label = "token mask"

    def check(self, lw, m):
        to = m.root.outputs[0].dtype
        if to is None or np.dtype(to).kind not in "fb":
            return "not a cast to float or bool"
        if lookup(lw, m.x) is None and (lw.get(m.x) is not None or not _from_graph_input(lw, m.x)):
            return "input is not an integer graph input (a 0/1 mask) nor a token mask"
        return None

    def rewrite(self, lw, m):
        to, src = m.root.outputs[0].dtype, lookup(lw, m.x)
        if src is None:
            return _record(lw, m.root.outputs[0], TwoValued(m.x, _cast(1, to), _cast(0, to)))
        return _record(lw, m.root.outputs[0], TwoValued(src.keep, _cast(src.on, to), _cast(src.off, to)))


class MaskLayout(Rule):
    """A layout op of a token mask: the same op on the integer mask."""

    pattern = Op(LAYOUT, Var("x"))
    label = "token mask layout"

    def check(self, lw, m):
        return None if lookup(lw, m.x) is not None else "input is not a token mask"

    def rewrite(self, lw, m):
        node, src = m.root, lookup(lw, m.x)
        keep = lw.node(
            node.op, [src.keep, *node.inputs[1:]], src.keep.dtype, node.op.lower(), attrs=node.attrs
        )
        return _record(lw, node.outputs[0], TwoValued(keep, src.on, src.off))


class MaskArith(Rule):
    """``mask ∘ k`` / ``k ∘ mask`` with a scalar float constant ``k``: both values computed in float32."""

    pattern = Op(_ARITH, Var("a"), Var("b"))
    label = "token mask arithmetic"

    def check(self, lw, m):
        a, b = lookup(lw, m.root.inputs[0]), lookup(lw, m.root.inputs[1])
        if (a is None) == (b is None):
            return "not one token mask and one constant"
        k = m.root.inputs[1 if a is not None else 0]
        return None if _scalar(lw, k) is not None else f"'{k.name}' is not a scalar float constant"

    def rewrite(self, lw, m):
        x, y = m.root.inputs[:2]
        src = lookup(lw, x) or lookup(lw, y)
        f = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Div": np.divide}[m.root.op]

        def apply(v):
            lhs = v if lookup(lw, x) is not None else _scalar(lw, x)
            rhs = v if lookup(lw, y) is not None else _scalar(lw, y)
            return np.float32(f(np.float32(lhs), np.float32(rhs)))

        return _record(lw, m.root.outputs[0], TwoValued(src.keep, apply(src.on), apply(src.off)))


def _branch(lw, t: gs.Tensor, keep: gs.Tensor) -> tuple[np.float32, np.float32] | None:
    """A Where branch's values where the mask is 1 and 0: a scalar constant, or a token mask of the same
    integer mask (Optimum's BERT: ``Where(bool(1 - mask), finfo.min, 1 - mask)``)."""
    k = _scalar(lw, t)
    if k is not None:
        return k, k
    tm = lookup(lw, t)
    return (tm.on, tm.off) if tm is not None and tm.keep is keep else None


class MaskWhere(Rule):
    """``Where(mask, a, b)`` with ``a``, ``b`` scalar constants or token masks of the same mask; ``Not(mask)``
    swaps the values."""

    pattern = Op(("Where", "Not"), Var("c"))
    label = "token mask select"

    def check(self, lw, m):
        src = lookup(lw, m.c)
        if src is None:
            return "condition is not a token mask"
        if m.root.op == "Where" and any(_branch(lw, t, src.keep) is None for t in m.root.inputs[1:3]):
            return "branches are not scalar constants nor the same token mask"
        return None

    def rewrite(self, lw, m):
        src = lookup(lw, m.c)
        if m.root.op == "Not":
            value = TwoValued(src.keep, np.float32(not src.on), np.float32(not src.off))
        else:
            (a_on, a_off), (b_on, b_off) = (_branch(lw, t, src.keep) for t in m.root.inputs[1:3])
            value = TwoValued(src.keep, a_on if src.on else b_on, a_off if src.off else b_off)
        return _record(lw, m.root.outputs[0], value)


class MaskAnd(Rule):
    """``And(mask, C)`` with ``C`` a constant that is true everywhere (Hugging Face ANDs the padding mask with
    a bidirectional mask of all True): the mask itself, broadcast by its consumers as the And would."""

    pattern = Op("And", Var("a"), Var("b"))
    label = "token mask and"

    def check(self, lw, m):
        masks = [t for t in m.root.inputs if lookup(lw, t) is not None]
        if len(masks) != 1:
            return "not one token mask and one constant"
        c = dequantized_const(m.root.inputs[1 - m.root.inputs.index(masks[0])])
        if c is None or c.dtype != np.bool_:
            return "the other operand is not a boolean constant"
        return None if c.all() else "the constant is not true everywhere (a causal or window mask)"

    def rewrite(self, lw, m):
        src = next(lookup(lw, t) for t in m.root.inputs if lookup(lw, t) is not None)
        return _record(lw, m.root.outputs[0], src)


def _scores_and_mask(lw, node: gs.Node):
    """``(scores, token mask)`` of an Add of an integer tensor and a token mask, else ``(None, None)``."""
    for s, k in (node.inputs, node.inputs[::-1]):
        if lw.get(s) is not None and lookup(lw, k) is not None:
            return s, lookup(lw, k)
    return None, None


def _symmetric_int32(a: Affine) -> Affine:
    return Affine(a.scale, 0, np.int32, bound=a.bound) if a.per_tensor else qparams.per_tensor(a)


class TokenMaskedAdd(Rule):
    """``Softmax(Add(scores, token mask))`` with mask values ``on`` and ``off <= on - T`` (``mask.threshold``:
    the float probability there is below half an output step): the scores where the mask is 0 become
    ``mask.masked_scores``'s fill, which the Shiftmax maps to exactly 0 (``on`` is the same for a whole row,
    and softmax ignores it). Every sequence must keep one token (a fully padded row comes out uniform)."""

    pattern = Op("Add", Var("a"), Var("b"))
    label = "attention mask from the input (Where)"

    def check(self, lw, m):
        scores, mask = _scores_and_mask(lw, m.root)
        if scores is None:
            return "not integer scores plus a token mask"
        got = _softmax_bits(lw, scores, m.root, "the sum")
        if isinstance(got, str):
            return got
        a, bits = got
        if float(mask.off) - float(mask.on) > -threshold(a, bits):
            return f"token mask values {mask.on:g} (kept) and {mask.off:g} (masked) do not mask the softmax"
        return None

    def rewrite(self, lw, m):
        scores, mask = _scores_and_mask(lw, m.root)
        zero = lw.const(np.array(0, mask.keep.dtype), "zero")
        masked = lw.node("Equal", [mask.keep, zero], np.bool_, "masked")
        out, t = masked_scores(lw, *lw.get(scores), masked, softmax_after(m.root.outputs[0]))
        out.shape = m.root.outputs[0].shape
        lw.set(m.root.outputs[0], out, t)  # masked_scores counts it ("attention mask (Where)")
        return Outcome.HANDLED


def _softmax_bits(lw, scores: gs.Tensor, node: gs.Node, what: str) -> tuple[Affine, int] | str:
    """The symmetric int32 type of ``scores`` and the probability bits of the Softmax that ``node``'s output
    reaches, or why there is none (``what`` names the output in the reason)."""
    softmax = softmax_after(node.outputs[0])
    if softmax is None:
        return f"{what} does not reach a last-axis Softmax through reshapes"
    a = _symmetric_int32(lw.get(scores)[1])
    try:
        _, _, bits = fill_type(a, *softmax_context(lw, softmax))
    except MaskError as e:
        return str(e)
    return a, bits


def _where_parts(lw, node: gs.Node):
    """``(scores, fill, masked_value)`` of ``Where(token mask, fill, scores)`` (or with the branches swapped)
    with a scalar constant fill and integer scores: the fill is taken where the condition equals
    ``masked_value``; else ``(None, None, None)``."""
    cond, a, b = node.inputs[:3]
    for scores, fill, picks_fill in ((b, a, True), (a, b, False)):
        if lw.get(scores) is not None and _scalar(lw, fill) is not None:
            return scores, _scalar(lw, fill), picks_fill
    return None, None, None


class TokenMaskedWhere(Rule):
    """``Softmax(Where(token mask, fill, scores))`` (DeBERTa-v2's ``Where(Not(mask), finfo.min, scores)``)
    with a fill at or below ``-T`` (``mask.threshold``: below every unmasked score by more than the float
    probability needs to round to 0): the same integer Where as :class:`TokenMaskedAdd`, so masked entries
    are exactly 0. Every sequence must keep one token."""

    pattern = Op("Where", Var("c"))
    label = "attention mask from the input (Where)"

    def check(self, lw, m):
        src = lookup(lw, m.c)
        if src is None:
            return "condition is not a token mask"
        scores, fill, picks_fill = _where_parts(lw, m.root)
        if scores is None:
            return "not a scalar constant fill and integer scores"
        if bool(src.on) == bool(src.off):
            return "the condition does not depend on the mask"
        got = _softmax_bits(lw, scores, m.root, "the masked scores")
        if isinstance(got, str):
            return got
        a, bits = got
        if float(fill) > -threshold(a, bits):
            return f"fill value {fill:g} does not mask the softmax (above {-threshold(a, bits):.3g})"
        return None

    def rewrite(self, lw, m):
        src = lookup(lw, m.c)
        scores, _, picks_fill = _where_parts(lw, m.root)
        # the fill is taken where the condition is true (false when the branches are swapped): at the mask
        # entries whose condition value says so, 1 (kept) or 0
        at = 1 if bool(src.on) == picks_fill else 0
        value = lw.const(np.array(at, src.keep.dtype), "masked_at")
        masked = lw.node("Equal", [src.keep, value], np.bool_, "masked")
        out, t = masked_scores(lw, *lw.get(scores), masked, softmax_after(m.root.outputs[0]))
        out.shape = m.root.outputs[0].shape
        lw.set(m.root.outputs[0], out, t)
        return Outcome.HANDLED


RULES = (MaskCast(), MaskLayout(), MaskArith(), MaskWhere(), MaskAnd(), TokenMaskedAdd(), TokenMaskedWhere())
