"""BatchNormalization rule (passes/rules/batchnorm.py): after a Conv, after a Linear (LeViT), behind Q/DQ and
on its own, with negative and zero ``gamma``: an int32 product by ``sign(k)*2**p`` plus an int32 bias, within
one output step of the fake-quant graph (the one Requantize), integer-only; and the reasons to decline."""

from __future__ import annotations

import numpy as np
import pytest

from tests.graphs import G, op_counts
from tests.passes._rules import RNG, X, declines, lowered


def _bn(g: G, x: str, c: int, zero: bool = True, n_out: int = 1, **attrs) -> str:
    """A BatchNormalization over ``c`` channels with negative entries in ``gamma`` (and one zero)."""
    gamma = RNG.uniform(0.3, 2.0, c) * np.where(np.arange(c) % 2, -1, 1)
    gamma[0] = 0.0 if zero else gamma[0]
    params = [gamma, RNG.standard_normal(c), RNG.standard_normal(c) * 0.5, RNG.uniform(0.2, 3.0, c)]
    y = g.node("BatchNormalization", [x, *(g.const(v) for v in params)], n_out, epsilon=1e-5, **attrs)
    return y if n_out == 1 else y[0]


def _counted(report) -> None:
    assert report.counts["lower_integer"]["BatchNormalization → int32 Mul + Add"] == 1


@pytest.mark.parametrize("between", [False, True])
def test_batchnorm_after_conv(between):
    """Conv → BatchNorm, directly (the per-channel accumulator) or with a Q/DQ pair between."""
    g = G()
    x = g.qdq(g.input("img", [1, 3, 6, 6]), 0.03, 5, np.uint8)
    y = g.node("Conv", [x, g.weight(RNG.standard_normal((4, 3, 3, 3)) * 0.3)], pads=[1, 1, 1, 1])
    y = g.qdq(y, 0.05) if between else y
    g.output(g.qdq(_bn(g, y, 4), 0.04))
    img = RNG.standard_normal((1, 3, 6, 6)).astype(np.float32)
    out, report = lowered(g.model(), {"img": img}, 0.04 + 1e-6)
    _counted(report)
    assert "BatchNormalization" not in op_counts(out) and op_counts(out)["ConvInteger"] == 1


def test_batchnorm_after_linear_levit():
    """LeViT's ``Linear`` → ``BatchNorm1d`` on the flattened tokens ``[B*N, C]``."""
    g = G()
    x = g.qdq(g.input("x", [2, 6, 16]), 0.05)
    y = g.node("MatMul", [x, g.weight(RNG.standard_normal((16, 8)) * 0.3, axis=1)])
    y = _bn(g, g.node("Reshape", [y, g.const([12, 8], np.int64)]), 8)
    g.output(g.qdq(g.node("Reshape", [y, g.const([2, 6, 8], np.int64)]), 0.05))
    _, report = lowered(g.model(), {"x": X}, 0.05 + 1e-6)
    _counted(report)


@pytest.mark.parametrize("zp, dtype", [(0, np.int8), (9, np.uint8)])
def test_batchnorm_of_a_quantized_activation(zp, dtype):
    """A BatchNorm on its own (``[N, C, L]``, ``C = 6``) of an 8-bit activation, with and without a zero
    point: every channel, negative and zero ``gamma`` included."""
    g = G()
    x = g.qdq(g.input("x", [2, 6, 16]), 0.03, zp, dtype)
    g.output(g.qdq(_bn(g, x, 6), 0.02))
    out, report = lowered(g.model(), {"x": X}, 0.02 + 1e-6)
    _counted(report)
    assert "Mul" in op_counts(out)  # the sign flip and shift


def test_batchnorm_with_a_bias_beyond_int32_input_steps():
    """``beta`` of 3e9 input steps: the input is first requantized to a coarser step (its last bits are far
    below the output step) so the int32 sum fits."""
    g = G()
    x = g.qdq(g.input("x", [2, 6, 16]), 0.03)
    params = [np.ones(6), RNG.uniform(0.8, 1.0, 6) * 1e8, np.zeros(6), np.ones(6)]
    g.output(g.qdq(g.node("BatchNormalization", [x, *(g.const(v) for v in params)]), 1e6))
    _, report = lowered(g.model(), {"x": X}, 1e6 + 1e-6)
    _counted(report)


@pytest.mark.parametrize(
    "case, reason",
    [
        ("float", "input is not quantized"),
        ("params", "scale, bias, mean and variance must be constants"),
        ("training", "training mode"),
    ],
)
def test_declines_with_the_reason(case, reason):
    g = G(opset=14)
    x = g.input("x", [2, 6, 16])
    x = x if case == "float" else g.qdq(x, 0.03)
    if case == "params":
        gamma = g.input("gamma", [6])
        params = [gamma, *(g.const(v) for v in (np.zeros(6), np.zeros(6), np.ones(6)))]
        y = g.node("BatchNormalization", [x, *params])
    else:
        y = _bn(g, x, 6, n_out=3 if case == "training" else 1, training_mode=int(case == "training"))
    g.output(g.qdq(y, 0.02))
    declines(g.model(), "BatchNormalization", reason)
