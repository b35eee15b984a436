"""Several rules for one op type: ``RULES`` holds one rule per op, so :class:`FirstOf` tries its rules in
order and lowers with the first whose pattern matches and whose check passes (the reasons of all are
joined when every one declines). :func:`ahead` puts extra rules in front of a ``RULES`` table."""

from __future__ import annotations

from ..pattern import OneOf, Rule, match


class FirstOf(Rule):
    """The first of ``rules`` that matches the node and does not decline."""

    def __init__(self, *rules: Rule):
        self.rules = rules
        self.pattern = OneOf(*(r.pattern for r in rules))

    def _pick(self, lw, node):
        reasons = []
        for r in self.rules:
            m = match(r.pattern, node)
            why = "pattern does not match" if m is None else r.check(lw, m)
            if why is None:
                return r, m
            reasons.append(why)
        return None, "; ".join(dict.fromkeys(reasons))

    def check(self, lw, m):
        rule, why = self._pick(lw, m.root)
        return None if rule is not None else why

    def rewrite(self, lw, m):
        rule, m2 = self._pick(lw, m.root)
        return rule.rewrite(lw, m2)


def ahead(table: dict[str, Rule], rules: tuple[Rule, ...]) -> dict[str, Rule]:
    """``table`` with ``rules`` tried first for every op type their patterns name (then the table's)."""
    out = dict(table)
    for op in dict.fromkeys(op for r in rules for op in r.pattern.ops):
        mine = [r for r in rules if op in r.pattern.ops]
        out[op] = FirstOf(*mine, *([table[op]] if op in table else []))
    return out
