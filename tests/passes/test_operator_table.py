"""docs/conversion.md's operator table is the rule table: every standard ONNX operator is listed with what
``rewrite`` does with it, every operator marked ``rule`` has a lowering rule and a rule test on a tiny graph,
and every lowering rule's operator is marked ``rule``."""

from __future__ import annotations

from pathlib import Path

from ivit_onnx.passes import operators
from ivit_onnx.passes.rules import RULES

ROOT = Path(__file__).parents[2]


def test_docs_table_is_the_generated_table():
    text = (ROOT / "docs" / "conversion.md").read_text()
    start, end = operators.MARKERS
    assert start in text and end in text, "docs/conversion.md has no operator table markers"
    quoted = text.split(start, 1)[1].split(end, 1)[0].strip()
    assert quoted == operators.markdown(), "table drifted: python -m ivit_onnx.passes.operators --docs"


def test_every_operator_is_listed_once_and_rules_match_the_rule_table():
    rows = operators.table()
    ops = [op for op, _, _ in rows]
    assert ops == operators.onnx_operators() and len(set(ops)) == len(ops)
    marked = {op for op, status, _ in rows if status == "rule"}
    assert marked == set(RULES) & set(ops) - set(operators.expanded_ops())
    listed = {op for group in operators.NO_RULE.values() for op in group}
    assert not listed & set(RULES), f"operators with a rule listed as having none: {listed & set(RULES)}"
    assert listed <= set(ops), f"unknown operators in NO_RULE: {listed - set(ops)}"


def test_every_rule_has_a_rule_test_on_a_tiny_graph():
    """A rule test builds a node of the operator (``g.node("Op", ...)`` or a pattern naming it) in
    ``tests/passes``, converts it and compares with the fake-quant graph (``tests/passes/_rules.py``)."""
    text = "".join(p.read_text() for p in (ROOT / "tests" / "passes").glob("test_*.py"))
    untested = [op for op, status, _ in operators.table()
                if status in ("rule", "expanded") and f'"{op}"' not in text]
    assert not untested, f"operators with a rule but no rule test: {untested}"
