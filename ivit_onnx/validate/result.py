"""What a validation found: each check with its status, the comparison and accuracy tables, per-layer rows
and run information. The ``--json`` file is :meth:`Result.as_dict`."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

PASSED, FAILED, WARNING, SKIPPED = "PASSED", "FAILED", "WARNING", "SKIPPED"


@dataclass
class Check:
    name: str
    status: str
    summary: str = ""
    details: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {"name": self.name, "status": self.status, "summary": self.summary, "details": self.details}


@dataclass
class Result:
    """Checks in order (WARNING and SKIPPED do not fail), metrics per comparison and output, accuracy on
    labels, per-layer rows (``--per-layer``), per-kernel rows (``--per-op``) and ``info`` (inputs, backends,
    throughput, errors)."""

    model: str
    checks: list[Check] = field(default_factory=list)
    comparisons: dict[str, dict] = field(default_factory=dict)
    accuracy: dict[str, dict] = field(default_factory=dict)
    per_layer: list = field(default_factory=list)
    per_op: list = field(default_factory=list)
    info: dict = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return all(c.status != FAILED for c in self.checks)

    @property
    def exit_code(self) -> int:
        return 0 if self.passed else 1

    def as_dict(self) -> dict:
        return _finite(
            {
                "model": self.model,
                "passed": self.passed,
                "exit_code": self.exit_code,
                **self.info,
                "checks": [c.as_dict() for c in self.checks],
                "comparisons": self.comparisons,
                "accuracy": self.accuracy,
                "per_layer": [r.as_dict() for r in self.per_layer],
                "per_op": [r.as_dict() for r in self.per_op],
            }
        )


def _finite(x):
    """JSON-safe: NaN/inf floats become None."""
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x
