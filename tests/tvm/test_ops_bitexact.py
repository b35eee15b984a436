"""Each private op, inlined and compiled for llvm by TVM, equals the numpy reference bit for bit.

Cases are random within each op's preconditions with the input type's extremes planted; several cases share
one model so that one compile checks them all.
"""

from __future__ import annotations

import numpy as np
import pytest
from _tvm_cases import GENERATORS, batch_feeds, batch_model
from hypothesis import given, settings
from hypothesis import strategies as st

from ivit_onnx.opset import OPS

tvm = pytest.importorskip("tvm")
from ivit_onnx.engines.tvm import compile_model  # noqa: E402

pytestmark = pytest.mark.tvm

SHAPES = [(1,), (3, 1), (2, 7), (2, 3, 16), (1, 2, 197)]


def _check(op: str, seed: int, opset: int, runtime: bool, per_model: int = 5):
    rng = np.random.default_rng(seed)
    cases = [GENERATORS[op](rng, SHAPES[i % len(SHAPES)]) for i in range(per_model)]
    art = compile_model(batch_model(op, cases, opset, runtime))
    outs = art.run(batch_feeds(cases, runtime))
    for (inputs, attrs), out in zip(cases, outs, strict=True):
        ref = OPS[op].run(*inputs, **attrs)
        assert out.dtype == ref.dtype and out.shape == ref.shape
        dtypes = [np.asarray(v).dtype.name for v in inputs]
        np.testing.assert_array_equal(out, ref, err_msg=f"{op} {attrs} {dtypes}")


@pytest.mark.parametrize("op", sorted(GENERATORS))
@settings(max_examples=2, deadline=None, derandomize=True)
@given(seed=st.integers(0, 2**32 - 1), opset=st.sampled_from([17, 18]))
def test_op_bitexact(op, seed, opset):
    """Parameters as initializers (constants in Relax), as a converted model has them."""
    _check(op, seed, opset, runtime=False)


@pytest.mark.parametrize("op", sorted(GENERATORS))
def test_op_bitexact_runtime_parameters(op):
    """Every input a graph input: the bodies' integer ops run in TVM instead of folding in the frontend."""
    _check(op, 7, 18, runtime=True, per_model=3)


def test_extremes_requantize():
    """int32 extremes through the widest multiplier and the largest shift, into each output type."""
    x = np.array([[np.iinfo(np.int32).min, -1, 0, 1, np.iinfo(np.int32).max]], np.int32)
    cases = []
    for yt in (np.int8, np.uint8, np.int16, np.int32):
        info = np.iinfo(yt)
        for b, c in ((2**29, 62), (-(2**29), 62), (1, 0), (2**29 - 1, 30), (3, 1)):
            cases.append(([x, np.int32(0), np.int64(b), np.int64(c), yt(0)],
                          {"qmin": int(info.min), "qmax": int(info.max)}))
    art = compile_model(batch_model("Requantize", cases))
    for (inputs, attrs), out in zip(cases, art.run(batch_feeds(cases)), strict=True):
        np.testing.assert_array_equal(out, OPS["Requantize"].run(*inputs, **attrs))


def test_extremes_shiftmax_long_rows():
    """4096-token rows at the largest n the precondition allows, constant and extreme-valued rows."""
    rng = np.random.default_rng(3)
    extreme = np.r_[2**31 - 1, np.full(4095, -2**31)]
    rows = np.stack([rng.integers(-2**31, 2**31, 4096), np.full(4096, 5), extreme])
    x = rows.astype(np.int32)[None]
    from ivit_onnx.opset.shift_exp import max_n

    cases = [([x, np.uint8(0)], {"x0": x0, "n": max_n(x0, 4096), "bits": 8}) for x0 in (1, 2**10, 2**20)]
    art = compile_model(batch_model("Shiftmax", cases))
    for (inputs, attrs), out in zip(cases, art.run(batch_feeds(cases)), strict=True):
        np.testing.assert_array_equal(out, OPS["Shiftmax"].run(*inputs, **attrs))
