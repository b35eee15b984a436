"""Undo the patch embedding's layout round trip at import, so its epilogue fuses into the GEMM.

After :mod:`..conv`, a patch embedding (a ConvInteger with kernel == stride, then the model's
``flatten(2).transpose(1, 2)``) reads::

    X [N,P,O] -> permute(0,2,1) -> reshape [N,O,h,w] -> Add(bias [O,1,1]) -> Requantize ...
              -> reshape [N,O,h*w] -> permute(0,2,1)                                     (P = h*w)

Relax fuses elementwise ops into a GEMM's epilogue but not across layout ops, so the GEMM stored its int32
accumulator in global memory. The two layout changes cancel, and the ops between them are elementwise with
scalar or per-channel constants, so the same ops run on ``X`` itself with their constants laid out for
``[N,P,O]`` (``[O,1,1]`` -> ``[O]``): the same integers, element for element.
"""

from __future__ import annotations

import numpy as np
from tvm import relax

from ..relax_expr import bound, const_value, dtype, is_call, static_shape


def relayout(value: np.ndarray, channels: int) -> np.ndarray | None:
    """A constant broadcast against ``[N,O,h,w]`` as the same constant against ``[N,P,O]``, else None."""
    if value.size == 1:
        return value.reshape(())
    dims = list(value.shape)
    while dims and dims[0] == 1:
        dims.pop(0)
    return value.reshape(channels) if dims == [channels, 1, 1] else None


def undo_round_trip(state, bb: relax.BlockBuilder, data):
    """The value of ``permute_dims(data, [0,2,1])`` computed without the round trip (see the module doc),
    or None where ``data`` is not the end of one. ``state`` is the import's :class:`.frontend._Import`."""
    r2 = bound(bb.lookup_binding, data)
    if not is_call(r2, "relax.reshape"):
        return None
    s4, s3 = static_shape(r2.args[0]), static_shape(r2)
    if s4 is None or len(s4) != 4 or s3 != [s4[0], s4[1], s4[2] * s4[3]]:
        return None
    chain, cur = [], r2.args[0]
    while True:
        if static_shape(cur) != s4:
            return None
        made = state.origin(cur)
        if made is not None and made.op == "Requantize":
            params = [const_value(p) for p in made.inputs[1:]]
            params = [None if p is None else relayout(p, s4[1]) for p in params]
            if any(p is None for p in params):
                return None
            chain.append((made, params))
            cur = made.inputs[0]
            continue
        value = bound(bb.lookup_binding, cur)
        if is_call(value, "relax.add"):
            consts = [const_value(a) for a in value.args]
            side = 1 if consts[1] is not None else 0 if consts[0] is not None else None
            bias = None if side is None else relayout(consts[side], s4[1])
            if bias is None:
                return None
            chain.append(("add", bias))
            cur = value.args[1 - side]
            continue
        break
    permuted = bound(bb.lookup_binding, value.args[0]) if is_call(value, "relax.reshape") else None
    if not is_call(permuted, "relax.permute_dims") or [int(a) for a in permuted.attrs.axes] != [0, 2, 1]:
        return None
    out = permuted.args[0]
    if static_shape(out) != [s4[0], s4[2] * s4[3], s4[1]]:
        return None
    for made, params in reversed(chain):
        if isinstance(made, str):  # the bias Add
            out = bb.emit(relax.op.add(out, relax.const(params, str(params.dtype))))
        else:
            out = state.emit(made.op, bb, [out, *[relax.const(p, str(p.dtype)) for p in params]], made.attrs)
    return out


def gather_as_slice(bb: relax.BlockBuilder, inputs: list, attr: dict):
    """``Gather(x, i, axis)`` with a constant scalar ``i`` as slice + squeeze, else None: TVM calls ``take``
    opaque (a data-dependent load), a slice is injective, so it can join the GEMM reading it (the class
    token before the head, :mod:`..prologue`). The same elements."""
    data, index = inputs[0], const_value(inputs[1])
    shape = static_shape(data)
    if index is None or index.ndim != 0 or shape is None or const_value(data) is not None:
        return None
    axis = int(attr.get("axis", 0)) % len(shape)
    i = int(index) % shape[axis]
    sliced = bb.emit(relax.op.strided_slice(data, axes=[axis], begin=[i], end=[i + 1]))
    return bb.emit(relax.op.squeeze(sliced, axis=[axis]))


def masked_scores(bb: relax.BlockBuilder, expr):
    """``(m, fill, s, mask_value)`` for ``expr = where(m [== mask_value], fill, astype(s, int32))`` with a
    constant ``fill`` and 8/16-bit scores ``s`` of the full shape (the attention mask rule's form), else
    None: :func:`.rows.shiftmax_masked` then reads ``s`` and the mask instead of the int32 result."""
    where = bound(bb.lookup_binding, expr)
    if not is_call(where, "relax.where") or const_value(where.args[1]) is None:
        return None
    cond, fill, wide = where.args
    cast = bound(bb.lookup_binding, wide)
    if not is_call(cast, "relax.astype") or dtype(cast) != "int32":
        return None
    if static_shape(cast) != static_shape(where):
        return None
    scores = cast.args[0]
    if dtype(scores) not in ("int8", "uint8", "int16", "uint16"):
        return None
    test = bound(bb.lookup_binding, cond)
    if is_call(test, "relax.equal"):
        value = const_value(test.args[1])
        if value is not None and value.size == 1:
            return test.args[0], fill, scores, int(value.reshape(()))
    return (cond, fill, scores, None) if dtype(cond) == "bool" else None


#: single-tensor layout ops a split's input may come through, re-emitted per output by :func:`split_as_slices`
_LAYOUT_OPS = ("relax.reshape", "relax.permute_dims")


def split_as_slices(bb: relax.BlockBuilder, split):
    """The outputs of ``split`` (an un-emitted ``relax.split`` call on a static shape) as a tuple of
    slices, each of its own copy of the reshape/transpose chain before the split, else None. A split is one
    kernel per output writing every head's Q, K, V; as separate single-use chains, each joins the attention
    GEMM reading it (:mod:`..prologue`). The same elements."""
    data, axis, parts = split.args[0], int(split.attrs.axis), split.attrs.indices_or_sections
    shape = static_shape(data)
    if shape is None:
        return None
    axis %= len(shape)
    if isinstance(parts, int) or hasattr(parts, "value"):
        n = int(parts)
        if shape[axis] % n:
            return None
        cuts = [shape[axis] // n * i for i in range(n + 1)]
    else:
        cuts = [0, *[int(c) for c in parts], shape[axis]]
    chain, base = [], data
    while any(is_call(bound(bb.lookup_binding, base), op) for op in _LAYOUT_OPS):
        chain.append(bound(bb.lookup_binding, base))
        base = chain[-1].args[0]
    outs = []
    for begin, end in zip(cuts[:-1], cuts[1:], strict=True):
        cur = base
        for call in reversed(chain):
            cur = bb.emit(relax.Call(call.op, [cur, *call.args[1:]], call.attrs, call.ty_args))
        outs.append(bb.emit(relax.op.strided_slice(cur, axes=[axis], begin=[begin], end=[end])))
    return relax.Tuple(outs)


__all__ = ["gather_as_slice", "masked_scores", "relayout", "split_as_slices", "undo_round_trip"]
