"""The integer attention mask (passes/rules/mask.py) against the normative Shiftmax reference: masked
entries at ``fill`` come out exactly 0 for scores of any scale and bound; only masks are taken as masks."""

from __future__ import annotations

import numpy as np
import pytest

from ivit_onnx import qparams
from ivit_onnx.affine import Affine
from ivit_onnx.opset import OPS
from ivit_onnx.passes.rules import mask

#: (output dtype, zero point) of the Shiftmax: a pow2 uint8/int8 target (bits 8 / 7) or none (16 bits, int32)
TARGETS = [
    (Affine(np.float64(2.0**-8), 0, np.uint8), 8),
    (Affine(np.float64(2.0**-7), 0, np.int8), 7),
    (Affine(np.float64(2.0**-8), -128, np.int8), 8),
    (None, qparams.SOFTMAX_DEFAULT_BITS),
]


@pytest.mark.parametrize("target, bits", TARGETS)
@pytest.mark.parametrize("scale", [1e-5, 3e-4, 0.01, 0.07, 0.5, 2.0])
@pytest.mark.parametrize("bound", [1, 127, 128, 32767, 2**20])
def test_fill_gives_exact_zeros_in_the_reference(target, bits, scale, bound):
    rng = np.random.default_rng(bound)
    row = 49
    a = Affine(np.float64(scale), 0, np.int32, bound=bound)
    fill, t, got_bits = mask.fill_type(a, row, target, 1024)
    assert got_bits == bits and t.bound == -fill
    sp = qparams.shiftmax(t, row, target, 1024)  # what the Softmax rule derives from the masked type
    x = rng.integers(-bound, bound, (64, row), endpoint=True)
    x[0] = bound  # rows at the extremes: all unmasked at the top, unmasked at the bottom
    x[1] = -bound
    masked = rng.random((64, row)) < 0.7
    masked[np.arange(64), rng.integers(0, row, 64)] = False  # every row keeps one unmasked entry
    scores = np.where(masked, fill, x) * sp.up.m  # the exact upscale Requantize (shift 0)
    assert np.abs(scores).max() < 2**31
    zy = np.array(sp.t.zero_point, sp.t.dtype)
    y = OPS["Shiftmax"].run(scores.astype(np.int32), zy, x0=sp.x0, n=sp.n, bits=sp.bits)
    assert np.all(y[masked] == zy) and np.all((y.astype(np.int64) - zy.astype(np.int64)).sum(-1) > 0)


@pytest.mark.parametrize("softmax", sorted(qparams.POLY_SOFTMAX))
@pytest.mark.parametrize("target, bits", TARGETS)
@pytest.mark.parametrize("scale", [1e-5, 3e-4, 0.07, 2.0])
@pytest.mark.parametrize("bound", [1, 128, 2**20])
def test_fill_gives_exact_zeros_with_polynomial_exps(softmax, target, bits, scale, bound):
    """``--softmax ibert|lis``: the same fill, through the grid's rescale (exact upscale or shift down) and
    the kernel's reference, is exactly 0 at every masked entry."""
    rng = np.random.default_rng(bound)
    row = 49
    a = Affine(np.float64(scale), 0, np.int32, bound=bound)
    fill, t, got_bits = mask.fill_type(a, row, target, 1024, softmax)
    assert got_bits == bits
    op = qparams.POLY_SOFTMAX[softmax]
    pp = qparams.poly_softmax(t, row, target, 1024)  # what the Softmax rule derives from the masked type
    x = rng.integers(-bound, bound, (64, row), endpoint=True)
    x[0], x[1] = bound, -bound
    masked = rng.random((64, row)) < 0.7
    masked[np.arange(64), rng.integers(0, row, 64)] = False
    lo, hi = pp.grid.a.qrange
    grid = OPS["Requantize"].run(
        np.where(masked, fill, x).astype(np.int32), np.int32(0), np.int64(pp.grid.m), np.int64(pp.grid.c),
        np.int32(0), qmin=lo, qmax=hi,
    )
    zy = np.array(pp.t.zero_point, pp.t.dtype)
    y = OPS[op].run(grid, zy, **pp.attrs(op))
    assert np.all(y[masked] == zy) and np.all((y.astype(np.int64) - zy.astype(np.int64)).sum(-1) > 0)


def test_too_wide_scores_are_refused():
    with pytest.raises(mask.MaskError):
        mask.fill_type(Affine(np.float64(1e-3), 0, np.int32, bound=2**31 - 100), 16, None, 1024)


@pytest.mark.parametrize(
    "c, why",
    [
        (np.array([[0.0, -100.0], [0.0, 0.0]]), None),
        (np.array([[0.0, -np.inf], [-3.4e38, 0.0]]), None),
        (np.zeros((2, 2)), "not a mask"),
        (np.array([[0.0, -1.0], [0.0, 0.0]]), "not a mask"),
        (np.array([[0.5, -100.0], [0.0, 0.0]]), "neither masked nor unmasked"),
        (np.array([[-100.0, -100.0], [0.0, 0.0]]), "masked entirely"),
        (np.array([[-100.0], [0.0]]), "whole rows"),
    ],
)
def test_which_constants_are_masks(c, why):
    got = mask._mask_reason(c, 30.0, [2, 2])
    assert (got is None) if why is None else (why in got), got
