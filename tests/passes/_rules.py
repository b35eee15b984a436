"""Helpers of the rule tests: lower a tiny graph and compare it with its fake-quant graph, read a decline."""

from __future__ import annotations

import numpy as np
import pytest

from ivit_onnx import ConversionError, Pipeline, rewrite
from ivit_onnx.certify import float_offenders
from tests.graphs import run

RNG = np.random.default_rng(7)
X = RNG.standard_normal((2, 6, 16)).astype(np.float32)


def lowered(fq, feeds: dict, atol: float, **options):
    """``rewrite(fq)``: integer-only (unless ``allow_float``) and within ``atol`` of ``fq`` on ``feeds``."""
    out, report = rewrite(fq, **options)
    if not options.get("allow_float"):
        assert float_offenders(out) == []
    got, ref = run(out, feeds)[0], run(fq, feeds)[0]
    assert np.max(np.abs(got.astype(np.float64) - ref)) <= atol
    return out, report


def declines(fq, op: str, reason: str) -> None:
    """Strict mode stops naming the ``op`` node with ``reason``; with allow_float the report says the same."""
    with pytest.raises(ConversionError) as e:
        rewrite(fq)
    assert f"{op} '" in str(e.value) and reason in str(e.value), str(e.value)
    _, report = rewrite(fq, allow_float=True)
    reasons = report.notes["float_island_reasons"]
    assert any(k.startswith(f"{op} '") and reason in v for k, v in reasons.items()), reasons
    assert reason in report.summary()


def fusion_declines(fq, pass_name: str, reason: str) -> None:
    """The fusion pass leaves the pattern alone and the report records why."""
    _, report = Pipeline.default().run(fq, stop_after=pass_name)
    assert not report.counts.get(pass_name)
    assert any(v == f"{pass_name}: {reason}" for v in report.notes.get("declined", {}).values()), report.notes


def backends_agree(out, feeds: dict) -> None:
    """The converted model gives the same bits on the library, the function bodies and the interpreter."""
    from ivit_onnx.runners import make_runner

    res = [make_runner(b, out).run(feeds) for b in ("library", "functions", "interpreter")]
    for r in res[1:]:
        assert all(np.array_equal(res[0][k], r[k]) for k in res[0])
