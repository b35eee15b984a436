"""The programmatic pipeline: reorder, extend with a user pass, stop after a named pass."""

from __future__ import annotations

import pytest

from ivit_onnx import Context, Pass, Pipeline, rewrite
from tests.graphs import op_counts
from tests.passes.test_lower_integer import _attention_like


class CountMatMuls(Pass):
    name = "count_matmuls"

    def run(self, ctx: Context) -> bool:
        ctx.count(self.name, "MatMul", sum(n.op == "MatMul" for n in ctx.graph.nodes))
        return False


def test_default_order():
    assert Pipeline.default().names == [
        "fold_constants",
        "normalize",
        "fuse_gelu",
        "fuse_layernorm",
        "fuse_l2norm",
        "fuse_softmax",
        "lower_integer",
        "attach_functions",
        "finalize",
    ]


def test_user_pass_runs_where_inserted_and_counts():
    p = Pipeline.default()
    p.insert_before("lower_integer", CountMatMuls())
    _, report = rewrite(_attention_like(), pipeline=p)
    assert report.counts["count_matmuls"] == {"MatMul": 1}
    assert report.passes_run.index("count_matmuls") == report.passes_run.index("lower_integer") - 1


def test_stop_after_leaves_the_graph_unlowered():
    model, report = rewrite(_attention_like(), stop_after="fuse_softmax")
    assert report.passes_run[-1] == "fuse_softmax"
    assert "MatMul" in op_counts(model) and "MatMulInteger" not in op_counts(model)


def test_unknown_pass_name():
    with pytest.raises(KeyError, match="no pass named"):
        Pipeline.default().remove("nope")


def test_requirements_are_checked():
    p = Pipeline.default()
    p.remove("normalize")
    with pytest.raises(Exception, match="requires"):
        rewrite(_attention_like(), pipeline=p)
