"""Rewrite rules, declaratively: a pattern to match, a check that says why it declines, and a rewrite.

A pattern is a tree of :class:`Op`, :class:`Var`, :class:`Const` and :class:`OneOf`, read from a node
upwards. Every edge steps over Q→DQ pairs (ORT puts them inside decomposed forms); two-input
Add/Mul/Max/Min match either way round; one pattern object binds one tensor, so ``Op("Mul", d, d)``
is a square. A :class:`Rule` is stateless; :class:`FusePass` applies its rules (all matches first, then
the edits) and records each decline's reason for the report and the float-island error.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from ivit_onnx.graph import const_array, dequantized_const, node_label, producer, through_qdq
from ivit_onnx.pipeline import Context, Pass

COMMUTATIVE = frozenset({"Add", "Mul", "Max", "Min"})
_NO = object()


class Match(dict):
    """Bindings by name (tensors for Var, values for Const, nodes for Op), the ``root`` node and the
    matched ``nodes``; ``same`` holds the tensor each pattern object met."""

    def __init__(self, root: gs.Node):
        super().__init__()
        self.root, self.nodes, self.same = root, [], {}

    def __getattr__(self, key):
        try:
            return self[key]
        except KeyError:
            raise AttributeError(key) from None


class Pattern:
    def __init__(self, name: str | None = None):
        self.name = name

    def match(self, t: gs.Tensor, m: Match) -> bool:
        """Match ``t``; a pattern object met again must meet the same tensor (through Q/DQ)."""
        if id(self) in m.same:
            return m.same[id(self)] is through_qdq(t)
        value = self._match(t, m)
        if value is not _NO:
            m.same[id(self)] = through_qdq(t)
            m.update({self.name: value} if self.name else {})
        return value is not _NO

    def _match(self, t: gs.Tensor, m: Match):  # pragma: no cover - interface
        raise NotImplementedError


class Var(Pattern):
    """Any tensor; binds it as the consumer sees it."""

    def _match(self, t, m):
        return t


class Const(Pattern):
    """A constant (or DequantizeLinear of one); with ``value``, a scalar within ``rtol`` of it. Binds
    the float value."""

    def __init__(self, value: float | None = None, name: str | None = None, rtol: float = 2e-3):
        super().__init__(name)
        self.value, self.rtol = value, rtol

    def _match(self, t, m):
        v, want = dequantized_const(t), self.value
        near = want is None or v is not None and v.size == 1 and abs(v.item() - want) <= self.rtol * abs(want)
        return v if v is not None and near else _NO


class Op(Pattern):
    """A node of type ``op`` (or any of a tuple) whose first inputs match ``inputs``; binds the node."""

    def __init__(self, op: str | tuple[str, ...], *inputs: Pattern, name: str | None = None):
        super().__init__(name)
        self.ops, self.inputs = (op,) if isinstance(op, str) else tuple(op), inputs

    def _match(self, t, m):
        node = producer(through_qdq(t))
        return node if node is not None and self.match_root(node, m) else _NO

    def match_root(self, node: gs.Node, m: Match) -> bool:
        if node.op not in self.ops or len(node.inputs) < len(self.inputs):
            return False
        orders = [node.inputs]
        if node.op in COMMUTATIVE and len(self.inputs) == 2:
            orders.append(node.inputs[::-1])
        for ins in orders:
            state = dict(m), dict(m.same), len(m.nodes)
            if all(p.match(x, m) for p, x in zip(self.inputs, ins, strict=False)):
                m.nodes.append(node)
                return True
            m.clear(), m.same.clear(), m.update(state[0]), m.same.update(state[1])
            del m.nodes[state[2] :]
        return False


class OneOf(Pattern):
    """The first alternative that matches (list the longest first)."""

    def __init__(self, *alternatives: Pattern, name: str | None = None):
        super().__init__(name)
        self.alternatives = alternatives
        self.ops = tuple(op for a in alternatives for op in getattr(a, "ops", ()))

    def _match(self, t, m):
        return t if any(a.match(t, m) for a in self.alternatives) else _NO

    def match_root(self, node: gs.Node, m: Match) -> bool:
        return any(isinstance(a, Op | OneOf) and a.match_root(node, m) for a in self.alternatives)


def match(pattern: Op | OneOf, node: gs.Node) -> Match | None:
    """Match ``pattern`` rooted at ``node`` (the root's own name binds the node), or None."""
    m = Match(node)
    if not pattern.match_root(node, m):
        return None
    if pattern.name:
        m[pattern.name] = node
    return m


class Rule:
    """One rewrite: ``pattern`` says what it looks at, ``check`` returns None or the reason it declines,
    ``rewrite`` builds the replacement. ``label`` is what the report counts."""

    pattern: Op | OneOf
    label = ""

    def check(self, ctx, m: Match) -> str | None:
        return None

    def rewrite(self, ctx, m: Match):  # pragma: no cover - interface
        raise NotImplementedError


class FusePass(Pass):
    """Applies ``rules`` once: every match first, then the edits. A rule's ``rewrite(ctx, m)`` returns
    ``(op, inputs, attrs)`` for the node that takes over the root's output (named ``<output>_<suffix>``)."""

    rules: tuple[Rule, ...] = ()
    suffix = "fused"

    def run(self, ctx: Context) -> bool:
        g = ctx.graph
        found: list[tuple[Rule, Match]] = []
        declined: list[tuple[gs.Node, str]] = []
        for node in g.nodes:
            for rule in self.rules:
                m = match(rule.pattern, node) if node.op in rule.pattern.ops else None
                why = rule.check(ctx, m) if m is not None else None
                if why:
                    declined.append((node, why))
                elif m is not None:
                    found.append((rule, m))
                    break
        inner = {id(n) for _, m in found for n in m.nodes if n is not m.root}
        found = [(r, m) for r, m in found if id(m.root) not in inner]  # the outermost match wins
        fused = {id(n) for _, m in found for n in m.nodes}  # a decline's reason goes to the report
        for node, why in (d for d in declined if id(d[0]) not in fused):
            ctx.notes.setdefault("declined", {})[node_label(node)] = f"{self.name}: {why}"
        for rule, m in found:
            op, inputs, attrs = rule.rewrite(ctx, m)
            out = m.root.outputs[0]
            m.root.outputs.clear()
            g.nodes.append(
                gs.Node(op, name=f"{out.name}_{self.suffix}", attrs=attrs, inputs=inputs, outputs=[out])
            )
            ctx.count(self.name, rule.label)
        if found:
            g.cleanup().toposort()
        return bool(found)


def last_axis(axes, t: gs.Tensor) -> bool:
    """``axes`` (an int, a list, or None when not constant) is exactly ``t``'s last axis."""
    axes = [axes] if isinstance(axes, int | np.integer) else axes
    if axes is None or len(axes) != 1:
        return False
    return axes[0] == -1 or (t.shape is not None and axes[0] == len(t.shape) - 1)


def reduce_axes(node: gs.Node) -> list[int] | None:
    """The axes of a Reduce* node (attribute before opset 18, input after), None if not constant."""
    if "axes" in node.attrs:
        return list(node.attrs["axes"])
    v = const_array(node.inputs[1]) if len(node.inputs) > 1 else None
    return None if v is None else [int(a) for a in v.ravel()]
