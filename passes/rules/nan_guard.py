"""SDPA's guard of fully masked rows, ``Where(IsNaN(p), 0, p)`` (the dynamo exporter, and TorchScript with
SDPA attention), on a lowered ``p``: integers are never NaN, so the guard is ``p`` itself.

The float model can only be NaN there for a row of ``-inf`` scores; Shiftmax's rows are finite (a row masked
entirely comes out uniform, as ``opset/README.md`` states).
"""

from __future__ import annotations

from ivit_onnx.graph import scalar_const

from ..pattern import Op, Rule, Var
from .lowerer import Outcome


def _never_nan(lw) -> set[str]:
    return lw.__dict__.setdefault("never_nan", set())


class IsNaNOfInteger(Rule):
    """``IsNaN(p)`` of a lowered ``p`` whose only readers are guards ``Where(IsNaN(p), c, p)``: false."""

    pattern = Op("IsNaN", Var("x"))
    label = "NaN guard"

    def check(self, lw, m):
        x, out = m.root.inputs[0], m.root.outputs[0]
        if lw.get(x) is None:
            return "input is not quantized"
        if not all(c.op == "Where" and c.inputs[0] is out and c.inputs[2] is x for c in out.outputs):
            return "not only read by Where(IsNaN(p), c, p)"
        return None

    def rewrite(self, lw, m):
        _never_nan(lw).add(m.root.outputs[0].name)
        return Outcome.HANDLED


class NaNGuard(Rule):
    """``Where(IsNaN(p), c, p)`` with ``IsNaN(p)`` known false and a scalar constant ``c``: ``p``."""

    pattern = Op("Where", Var("c"), Var("a"), Var("b"))
    label = "NaN guard"

    def check(self, lw, m):
        cond, a, b = m.root.inputs
        if cond.name not in _never_nan(lw):
            return "condition is not IsNaN of an integer tensor"
        return None if scalar_const(a) is not None and lw.get(b) is not None else "not Where(IsNaN(p), c, p)"

    def rewrite(self, lw, m):
        lw.set(m.root.outputs[0], *lw.get(m.root.inputs[2]))
        lw.ctx.count("lower_integer", "Where(IsNaN(p), c, p) → p (integers are never NaN)")
        return Outcome.HANDLED


RULES = (IsNaNOfInteger(), NaNGuard())
