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

from ..relax_expr import const_value, is_call


def _bound(bb: relax.BlockBuilder, expr):
    """The expression bound to ``expr`` (through var-to-var bindings), else ``expr``."""
    while isinstance(expr, relax.Var):
        value = bb.lookup_binding(expr)
        if value is None:
            break
        expr = value
    return expr


def _shape(expr) -> list[int] | None:
    shape = getattr(expr.ty, "shape", None)
    if shape is None or not all(hasattr(d, "value") for d in shape):
        return None
    return [int(d.value) for d in shape]


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
    r2 = _bound(bb, data)
    if not is_call(r2, "relax.reshape"):
        return None
    s4, s3 = _shape(r2.args[0]), _shape(r2)
    if s4 is None or len(s4) != 4 or s3 != [s4[0], s4[1], s4[2] * s4[3]]:
        return None
    chain, cur = [], r2.args[0]
    while True:
        if _shape(cur) != s4:
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
        value = _bound(bb, cur)
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
    permuted = _bound(bb, value.args[0]) if is_call(value, "relax.reshape") else None
    if not is_call(permuted, "relax.permute_dims") or [int(a) for a in permuted.attrs.axes] != [0, 2, 1]:
        return None
    out = permuted.args[0]
    if _shape(out) != [s4[0], s4[2] * s4[3], s4[1]]:
        return None
    for made, params in reversed(chain):
        if isinstance(made, str):  # the bias Add
            out = bb.emit(relax.op.add(out, relax.const(params, str(params.dtype))))
        else:
            out = state.emit(made.op, bb, [out, *[relax.const(p, str(p.dtype)) for p in params]], made.attrs)
    return out


__all__ = ["relayout", "undo_round_trip"]
