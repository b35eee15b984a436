"""LpNormalization (p=2, last axis; ``fuse_l2norm``'s marker for ``F.normalize``) → IL2Norm.

The input's zero point is removed inside the op; a per-channel accumulator first becomes per tensor, an input
too wide for an exact sum of squares is shifted down first (``qparams.l2norm``). The output is written in the
following QuantizeLinear's type where that is per tensor, else int16 at ``2**-15``. ``eps`` is 0: the marker
is exact only where ``F.normalize``'s ``eps`` lies below the input's step (the fusion checks it, or, for an
input computed in integers, this rule, from the input's type).
"""

from __future__ import annotations

import numpy as np

from ivit_onnx import qparams

from ..fuse_l2norm import EPS_NOTE
from ..pattern import Op, Rule, last_axis
from .nonlinear import _emit, _last_dim


class L2Norm(Rule):
    """LpNormalization with p=2 over the last axis → IL2Norm, requantized inside."""

    pattern = Op("LpNormalization")

    def check(self, lw, m):
        node = m.root
        if lw.missing(node.inputs[0]):
            return lw.missing(node.inputs[0])
        if node.attrs.get("p", 2) != 2:
            return f"p={node.attrs['p']}: only the L2 norm has an integer kernel"
        if not last_axis(node.attrs.get("axis", -1), node.inputs[0]):
            return "not over the last axis"
        if _last_dim(node.inputs[0]) is None:
            return "the row length is unknown"
        eps = lw.ctx.notes.get(EPS_NOTE, {}).get(node.outputs[0].name)
        step = float(np.min(lw.get(node.inputs[0])[1].scale))
        if eps is not None and eps > step:
            return f"epsilon {eps:.3g} exceeds the input's quantization step {step:.3g}"
        return None

    def rewrite(self, lw, m):
        node = m.root
        it, a = lw.per_tensor(*lw.get(node.inputs[0]))
        lp = qparams.l2norm(a, _last_dim(node.inputs[0]), 0.0, lw.target(node.outputs[0]),
                            lw.opt.ln_fraction_bits, lw.dyadic)
        if lp.pre is not None:
            it, a = lw.requantize(it, a, lp.pre, "l2_in"), lp.pre
        inputs = [it, lw.zp(lp.zero_point, a.dtype, "x_zp"), lw.const(lp.multiplier, "mult"),
                  lw.const(lp.shift, "shift")]
        return _emit(lw, node, "IL2Norm", inputs, lp.t, shift_in=lp.shift_in, eps=lp.eps, p=lp.p)
