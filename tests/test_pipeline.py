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
        "fix_random",
        "normalize",
        "expand_norms",
        "expand_einsum",
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


def test_one_table_of_kernel_choices():
    """``qparams.KERNELS`` is the only place a ``--softmax/--gelu/--layernorm`` choice maps to its op: the
    options, the rules' emitters, the approximation tables and the torch QAT kernels are views of it."""
    import ast
    from pathlib import Path

    from ivit_onnx import qparams
    from ivit_onnx.opset import OPS
    from ivit_onnx.opset.approx import KERNEL_OPS
    from ivit_onnx.passes.rules import nonlinear
    from ivit_onnx.pipeline import KERNELS

    assert KERNELS == {kind: tuple(choices) for kind, choices in qparams.KERNELS.items()}
    assert KERNEL_OPS == {kind: {c: k.op for c, k in ch.items()} for kind, ch in qparams.KERNELS.items()}
    for kind, emitters in (("softmax", nonlinear.SOFTMAX), ("gelu", nonlinear.GELU),
                           ("layernorm", nonlinear.LAYERNORM)):
        assert set(emitters) == set(qparams.KERNELS[kind])
    for kernel in qparams.BY_OP.values():
        assert kernel.op in OPS and set(kernel.attrs) <= set(OPS[kernel.op].attributes)
    # no other module spells a choice next to its op (the restatements this table replaced)
    root = Path(__file__).parents[1]
    for path in [*root.glob("passes/**/*.py"), *root.glob("opset/*.py"), *root.glob("models/*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Dict):
                pairs = {(getattr(k, "value", None), getattr(v, "value", None))
                         for k, v in zip(node.keys, node.values, strict=True)}
                table = {(c, k.op) for ch in qparams.KERNELS.values() for c, k in ch.items()}
                assert not pairs & table, f"{path}: restates the kernel table {pairs & table}"
