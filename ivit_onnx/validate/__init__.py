"""Validate an integer-only model: certify it, run it on every backend (bit-exactly alike), compare it with
the fake-quant and FP32 models. ``validate(options) -> Result``; the CLI (``python -m ivit_onnx.validate``)
prints :func:`render.render` of the result and writes :meth:`Result.as_dict` as ``--json``.

One job per module: ``options`` (what to validate, loading the models), ``checks`` (static checks),
``run`` (the runs and cross-checks), ``metrics`` (comparisons against thresholds), ``render`` (text),
``result`` (the result object), ``cli`` (argument parsing and exit codes).
"""

from __future__ import annotations

from .cli import main, parser
from .options import ValidateOptions
from .result import Check, Result


def validate(opts: ValidateOptions) -> Result:
    """Load the models the options name and run every check; bad input raises ``InputError``."""
    from .run import Session

    return Session(opts).run(*opts.models())


__all__ = ["Check", "Result", "ValidateOptions", "main", "parser", "validate"]
