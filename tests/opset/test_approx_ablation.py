"""How close the paper's Softmax ablation kernels come to float (IBertSoftmax, LogIntSoftmax), set up as the
converter sets them up (``ivit_onnx.qparams.poly_softmax``: the scores' grid upscaled exactly or shifted
down to ``x0`` in ``[1024, 2048]``, I-BERT's coefficients on it, ``n`` from ``max_n``), on the attention-like
scores of :mod:`ivit_onnx.opset.approx` (``softmax_cases``), which also runs the kernels. Errors are absolute,
also in LSBs of the output scale ``2**-bits``.

- IBertSoftmax against the float softmax of the same integers, next to Shiftmax at the same precision.
- LogIntSoftmax against FQ-ViT's own float formula on that float softmax (``2**-q`` for ``q =
  log_round(round(1/p))``, 0 from ``q = 16``; on the ``2**-bits`` grid), level for level: the integer exp
  moves an element across a rounding threshold rarely, and then by one level; and against the float softmax
  itself (a level ``2**-q`` is within ``p/2`` of ``p``: the 4-bit log quantization, not the integer kernel).

Bounds were set from the measurements with some margin. ``python -m tests.opset.test_approx_ablation``
prints the measured table.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from ivit_onnx import qparams
from ivit_onnx.opset import log_int_softmax as lis
from ivit_onnx.opset.approx import Err, run_softmax, softmax, softmax_cases


def fq_vit_levels(p: np.ndarray, bits: int, log_bits: int = qparams.LIS_LOG_BITS) -> np.ndarray:
    """FQ-ViT's LIS of float probabilities ``p`` (``round(sum/exp) = round(1/p)``, half up as ours), as the
    level index ``0..K`` of :func:`ivit_onnx.opset.log_int_softmax.level_values`."""
    v = np.floor(1.0 / np.maximum(p, 1e-300) + 0.5)
    big = np.floor(np.log2(v))
    q = big + (v - 2.0**big >= 2.0 ** (big - 1)) * (big >= 1)
    return np.minimum(q, lis.levels(bits, log_bits)).astype(np.int64)


def level_of(y: np.ndarray, bits: int) -> np.ndarray:
    """The level index of LogIntSoftmax outputs (probabilities on the ``2**-bits`` grid)."""
    k = lis.levels(bits, qparams.LIS_LOG_BITS)
    values = lis.level_values(bits, k) * 2.0**-bits
    return np.argmin(np.abs(y[..., None] - values[None]), axis=-1)


@dataclass
class LisErr:
    moved: float  #: fraction of elements whose level differs from FQ-ViT's float formula
    most: int  #: the largest level difference
    vs_float: Err  #: against the float softmax

    def __str__(self) -> str:
        return f"levels moved {100 * self.moved:.3f}% (at most {self.most}) | vs float {self.vs_float}"


def lis_errors(x, s, bits: int = 8, yt=np.uint8) -> LisErr:
    p = softmax(x.astype(np.float64) * s)
    y = run_softmax("LogIntSoftmax", x, s, yt, bits)
    diff = np.abs(level_of(y, bits) - fq_vit_levels(p, bits))
    return LisErr(float((diff > 0).mean()), int(diff.max()), Err.of(y, p, 2.0**-bits))


def ibert_errors(x, s):
    want = softmax(x.astype(np.float64) * s)
    return (
        Err.of(run_softmax("IBertSoftmax", x, s, np.int8, 7), want, 2.0**-7),
        Err.of(run_softmax("IBertSoftmax", x, s, np.int16, 15), want, 2.0**-15),
        Err.of(run_softmax("Shiftmax", x, s, np.int16, 15), want, 2.0**-15),
    )


CASES = dict(softmax_cases())


# |IBertSoftmax - softmax| with 7 fraction bits: measured max 1.09 LSB (int_div floors: up to 1 LSB by
# itself), mean 0.50 LSB; with 15 bits: measured max 27.2 LSB (8.3e-4), mean 0.61 LSB, Shiftmax's max 480 LSB
IBERT_MAX_7, IBERT_MEAN_7 = 1.15 * 2.0**-7, 0.55 * 2.0**-7
IBERT_MAX_15, IBERT_MEAN_15 = 9e-4, 0.7 * 2.0**-15


@pytest.mark.parametrize("case", CASES)
def test_ibert_softmax(case):
    o7, o15, shiftmax15 = ibert_errors(*CASES[case])
    assert o7.max <= IBERT_MAX_7 and o7.mean <= IBERT_MEAN_7, o7
    assert o15.max <= IBERT_MAX_15 and o15.mean <= IBERT_MEAN_15, o15
    assert o15.max < shiftmax15.max, (o15, shiftmax15)  # the polynomial beats the linear shift-exp


#: LogIntSoftmax against FQ-ViT's float formula: measured at most 0.28% of the elements one level off
LIS_MOVED = 0.0035


@pytest.mark.parametrize("bits, yt", [(8, np.uint8), (16, np.int32)])
@pytest.mark.parametrize("case", CASES)
def test_log_int_softmax(case, bits, yt):
    x, s = CASES[case]
    err = lis_errors(x, s, bits, yt)
    assert err.most <= 1 and err.moved <= LIS_MOVED, err
    # the log quantization itself: a level is within p/2 of p (measured: p/2 + 0.67 LSB at most)
    p = softmax(x.astype(np.float64) * s)
    y = run_softmax("LogIntSoftmax", x, s, yt, bits)
    assert np.all(np.abs(y - p) <= p / 2 + 2.0**-bits)


def test_fq_vit_levels_of_exact_ratios():
    """:func:`fq_vit_levels` is FQ-ViT's ``log_round`` (floor(log2 v) + [v - 2**floor >= 2**(floor-1)]) of
    ``round(1/p)``: level 0 up to v < 2, 1 for 2, 2 for 3..5, 3 for 6..11, 4 for 12..23, then 0 from 2**16."""
    v = np.array([1, 1.49, 1.5, 2, 2.49, 2.5, 5, 5.49, 5.5, 11.4, 11.5, 23.5, 49151.4, 49151.5, 1e9])
    assert fq_vit_levels(1 / v, 30, 4).tolist() == [0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 4, 5, 15, 16, 16]


def table() -> None:  # pragma: no cover - run as a script
    for name, (x, s) in CASES.items():
        o7, o15, shiftmax15 = ibert_errors(x, s)
        print(f"IBertSoftmax {name}: 7b {o7} | 15b {o15} | Shiftmax 15b {shiftmax15}")
        for bits, yt in ((8, np.uint8), (16, np.int32)):
            print(f"LogIntSoftmax {name} {bits}b: {lis_errors(x, s, bits, yt)}")


if __name__ == "__main__":  # pragma: no cover
    table()
