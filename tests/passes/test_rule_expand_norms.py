"""GroupNormalization / InstanceNormalization (passes/expand_norms.py) as ILayerNorm over each group's row,
then the per-channel scale and bias: against the fake-quant graph within a few output steps."""

from __future__ import annotations

import numpy as np
import pytest

from tests.graphs import G, op_counts
from tests.passes._rules import lowered

RNG = np.random.default_rng(5)
X4 = RNG.standard_normal((2, 8, 3, 3)).astype(np.float32) * 2 + 0.5


@pytest.mark.parametrize(
    "op, opset, groups",
    [("GroupNormalization", 21, 2), ("GroupNormalization", 21, 4), ("InstanceNormalization", 17, 8)],
)
def test_group_and_instance_norm_are_ilayernorm_rows(op, opset, groups):
    g = G(opset=opset)
    x = g.qdq(g.input("x", [2, 8, 3, 3]), 0.05)
    n = 8  # a scale and bias per channel (opset 21's GroupNormalization; 18's per group is deprecated)
    scale, bias = g.const(np.linspace(0.5, 1.5, n)), g.const(np.linspace(-0.2, 0.3, n))
    attrs = {"num_groups": groups, "epsilon": 1e-5} if op == "GroupNormalization" else {"epsilon": 1e-5}
    g.output(g.qdq(g.node(op, [x, scale, bias], **attrs), 0.03), [2, 8, 3, 3])
    out, report = lowered(g.model(), {"x": X4}, 3 * 0.03 + 1e-6)
    assert op_counts(out).get("ai.ivit:ILayerNorm") == 1
    assert report.counts["expand_norms"] == {f"{op} as LayerNorm rows": 1}
