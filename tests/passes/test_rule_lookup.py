"""Table lookups (passes/rules/lookup.py): Tanh / Sigmoid of an 8-bit input, quantized after, as a Gather of
a 256-entry table equal to the fake-quant model; wider inputs and unquantized outputs declined."""

from __future__ import annotations

import numpy as np
import pytest

from tests.graphs import G, op_counts
from tests.passes._rules import declines, lowered

#: every int8 input value once
EVERY = (np.arange(-128, 128, dtype=np.float32) * 0.03).reshape(2, 8, 16)


@pytest.mark.parametrize("op", ["Tanh", "Sigmoid"])
@pytest.mark.parametrize("dtype, zp", [(np.int8, 0), (np.uint8, 128), (np.uint8, 37)])
def test_table_equals_the_fake_quant_model_on_every_input(op, dtype, zp):
    g = G()
    x = g.qdq(g.input("x", [2, 8, 16]), 0.03, zp, dtype)
    g.output(g.qdq(g.node(op, [x]), 1 / 127, 0 if op == "Tanh" else -128))
    fq = g.model()
    out, report = lowered(fq, {"x": EVERY}, atol=0)
    assert op_counts(out).get("Gather") == 1 and op not in op_counts(out)
    assert report.counts["lower_integer"][f"{op} → table lookup (Gather)"] == 1


def _decline_graph(case):
    g = G(opset=21)  # 16-bit Q/DQ
    x = g.qdq(g.input("x", [2, 6, 16]), 0.03, 0, np.int16 if case == "int16" else np.int8)
    y = g.node("Tanh", [x])
    g.output(y if case == "float_out" else g.qdq(y, 1 / 127))
    return g.model()


@pytest.mark.parametrize(
    "case, reason",
    [
        ("int16", "a table lookup needs an 8-bit per-tensor input, got int16"),
        ("float_out", "its output is not quantized"),
    ],
)
def test_declines_with_the_reason(case, reason):
    declines(_decline_graph(case), "Tanh", reason)
