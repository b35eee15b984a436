"""The Softmax ablation ops (IBertSoftmax, LogIntSoftmax) beyond the generic bit-exactness of
``tests/opset/test_bitexact.py``: what their reference kernels compute against the sources' formulas (I-BERT's
polynomial on the ``ln 2`` grid; FQ-ViT's ``log_round(round(sum/exp))``, in exact rational arithmetic), the
compiled kernels' table and clamp paths at every thread count, and the custom-op library refusing attributes
outside the kernels' range at session creation, naming the node."""

from __future__ import annotations

import json
import math
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto

from ivit_onnx import qparams
from ivit_onnx.opset import OPS, native_kernels
from ivit_onnx.opset import log_int_softmax as lis
from ivit_onnx.opset.ort_library import native_library
from ivit_onnx.opset.poly_exp import norm_shift, poly_exp, row_exps
from ivit_onnx.opset.shift_exp import max_n
from tests.qemu import QEMU_X86, haswell

RNG = np.random.default_rng(20261126)
POLY = ("IBertSoftmax", "LogIntSoftmax")


def attrs_of(op: str, x0: int, row: int, bits: int = 8, n: int | None = None) -> dict:
    qb, qc = qparams.poly_coefficients(x0)
    attrs = {"x0": x0, "qb": qb, "qc": qc, "n": max_n(qb * qb + qc, row) if n is None else n, "bits": bits}
    return {**attrs, "log_bits": qparams.LIS_LOG_BITS} if op == "LogIntSoftmax" else attrs


# ------------------------------------------------------------------------------------- the formulas


def test_polynomial_is_i_bert_s():
    """I-BERT's L(p) = 0.3585 (p + 1.353)**2 + 0.344 is within 0.31% of exp on (-ln2, 0]; on the converter's
    grids (x0 in [1024, 2048]) the integer exp, over the whole clamp range, stays within a 0.56% band around
    exp(d ln2 / x0) (measured 0.557%): the relative error the softmax sees."""
    p = np.linspace(-math.log(2), 0, 100001)
    poly = qparams.IBERT_A * (p + qparams.IBERT_B) ** 2 + qparams.IBERT_C
    assert np.abs(poly / np.exp(p) - 1).max() <= 0.0031
    for x0 in (1024, 1531, 2048):
        qb, qc = qparams.poly_coefficients(x0)
        d = np.arange(-30 * x0, 1)
        ratio = poly_exp(d, x0, qb, qc, 30) / np.exp(d * math.log(2) / x0)
        assert ratio.max() / ratio.min() - 1 <= 0.0056


def test_exp_is_the_shifted_polynomial():
    """``poly_exp(d) = ((qb - r)**2 + qc) * 2**(n - q)``, ``d = -(q x0 + r)``, clamped at ``q = n``; the
    normalization keeps every exp below 2**31 and the largest at or above 2**30."""
    x0, n = 1500, 25
    qb, qc = qparams.poly_coefficients(x0)
    for q, r in [(0, 0), (0, 1), (0, x0 - 1), (7, 3), (n, 0)]:
        assert poly_exp(np.array([-(q * x0 + r)]), x0, qb, qc, n)[0] == ((qb - r) ** 2 + qc) << (n - q)
    assert poly_exp(np.array([-(n * x0 + 1), -(10**9)]), x0, qb, qc, n).tolist() == [qb * qb + qc] * 2
    k = norm_shift(qb, qc, n)
    top = ((qb * qb + qc) << n) >> k
    assert 2**30 <= top < 2**31
    e, _ = row_exps(np.array([[0, -5, -(10**6)]]), x0, qb, qc, n, k)
    assert e[0, 0] == top and e.max() < 2**31


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(
    row=st.integers(1, 40),
    x0=st.sampled_from([1, 3, 30, 1024, 2048]),
    bits=st.integers(1, 30),
    log_bits=st.integers(1, 5),
    spread=st.sampled_from([3, 50, 2000, 100000]),
    seed=st.integers(0, 2**32 - 1),
)
def test_log_int_softmax_is_fq_vit_s_formula(row, x0, bits, log_bits, spread, seed):
    """On the same exps, LogIntSoftmax equals FQ-ViT's ``v = round(sum/exp)`` (half up), ``q = floor(log2 v)
    + [v - 2**floor(log2 v) >= 2**(floor(log2 v) - 1)]``, ``2**-q`` for ``q < 2**log_bits``, else 0, written
    as ``floor(2**bits * 2**-q)`` clipped to ``2**bits - 1`` -- in exact rational arithmetic."""
    x = np.random.default_rng(seed).integers(-spread, 1, (2, row))
    attrs = attrs_of("LogIntSoftmax", x0, row, bits)
    attrs["log_bits"] = log_bits
    e, total = row_exps(x, *(attrs[k] for k in ("x0", "qb", "qc", "n")))
    y = OPS["LogIntSoftmax"].run(x.astype(np.int32), np.int32(0), **attrs)
    for ej, sj, yj in zip(e.reshape(-1).tolist(), np.repeat(total, row).tolist(), y.reshape(-1).tolist(),
                          strict=True):
        v = math.floor(Fraction(sj, ej) + Fraction(1, 2))
        big = v.bit_length() - 1
        q = big + (1 if big >= 1 and v - 2**big >= 2 ** (big - 1) else 0)
        want = 0 if q >= 2**log_bits else math.floor(Fraction(2**bits, 2**q))
        assert yj == min(want, 2**bits - 1), (ej, sj, q)


def test_levels_and_divisors():
    """``K`` levels (FQ-ViT's 16, fewer where 2**-q is below the output grid), ``D_k = 2 T_k - 1`` for the
    thresholds ``T = 2, 3, 6, 12, ...`` of ``log_round``, and each level's output integer."""
    assert lis.levels(8, 4) == 9 and lis.levels(16, 4) == 16 and lis.levels(30, 5) == 31
    assert lis.divisors(5) == [3, 5, 11, 23, 47]
    assert lis.level_values(8, 9).tolist() == [255, 128, 64, 32, 16, 8, 4, 2, 1, 0]
    assert lis.level_values(16, 16).tolist()[-3:] == [4, 2, 0]  # 2**-15 is the last level, 2**-16 is 0


# ------------------------------------------------------------------------------ the compiled kernels


needs_native = pytest.mark.skipif(not native_kernels.available(), reason="native kernels not built")


@needs_native
@pytest.mark.parametrize("op", POLY)
@pytest.mark.parametrize("x0", [1, 37, 1024, 2048, 1 << 20])
@pytest.mark.parametrize("span", [64, 3000, 200000, 1 << 30])
def test_native_tables_and_clamp(op, x0, span):
    """Rows whose spread runs from 0 past the clamp point ``n x0`` (exp table, clamped lookups) or past any
    table (direct exps), on 1, 2 and 5 threads; equal to the reference."""
    from tests.opset.test_native import both

    x = RNG.integers(-span // 2, span // 2, (600, 197), endpoint=True).astype(np.int32)
    x[:, 0] = span // 2
    x[1, :] = np.arange(197) * (span // 197 + 1) - span // 2
    y = both(op, x, np.uint8(0), **attrs_of(op, x0, 197))
    assert y.max() > 0


@needs_native
@pytest.mark.parametrize("op", POLY)
def test_native_declines_attributes_outside_its_range(op):
    """Attributes the kernels do not compute go to the numpy reference (``STATS``), never to a wrong loop."""
    x = RNG.integers(-100, 100, (3, 7)).astype(np.int8)
    bad = [{"qb": 1}, {"qc": -1}, {"n": 61}, {"bits": 31}]
    bad += [{"log_bits": 6}] if op == "LogIntSoftmax" else []
    for change in bad:
        attrs = {**attrs_of(op, 30, 7), **change}
        before = native_kernels.STATS[f"{op}/numpy"]
        native_kernels.run(op, OPS[op].reference, x, np.int16(0), **attrs)
        assert native_kernels.STATS[f"{op}/numpy"] == before + 1, change


needs_library = pytest.mark.skipif(native_library() is None, reason="native library not built")


@needs_library
@pytest.mark.parametrize(
    "op, change, expected",
    [
        ("IBertSoftmax", {"bits": 31}, "attribute bits=31 is outside 1..30"),
        ("IBertSoftmax", {"qb": 10}, "the exp needs 1 <= x0 <= qb <= 2**30"),
        ("IBertSoftmax", {"qc": -2}, "the exp needs 0 <= qc <= 2**60"),
        ("LogIntSoftmax", {"n": 45}, "the exp needs (qb**2 + qc) * 2**n < 2**61"),
        ("LogIntSoftmax", {"log_bits": 0}, "attribute log_bits=0 is outside 1..5"),
    ],
)
def test_attribute_refused_at_session_creation(op, change, expected):
    from tests.opset.test_native_ort import bare_model, library_session

    attrs = {**attrs_of(op, 1024, 5), **change}
    inputs = [("x", TensorProto.INT32, [2, 5]), ("zy", TensorProto.UINT8, [])]
    model = bare_model(op, inputs, attrs, TensorProto.UINT8)
    with pytest.raises(Exception, match=f"ai.ivit {op} node 'the_node' refused") as info:
        library_session(model, native_library())
    assert expected in str(info.value)



EMULATED = """
import json, numpy as np
from ivit_onnx.opset import OPS, native_kernels
from tests.qemu import QEMU_X86, haswell
from tests.opset.test_softmax_ablation import attrs_of
rng, bad = np.random.default_rng(3), []
for op in ("IBertSoftmax", "LogIntSoftmax"):
    for x0, span in ((37, 64), (1024, 3000), (2048, 200000), (1 << 20, 1 << 30)):  # tables, then direct exps
        x = rng.integers(-span // 2, span // 2, (80, 197), endpoint=True).astype(np.int32)
        x[:, 0] = span // 2
        for yt, zy in ((np.uint8, 0), (np.int8, -128), (np.int32, 5)):
            attrs = attrs_of(op, x0, 197)
            got = native_kernels.KERNELS[op](x, yt(zy), **attrs)
            if got is None or not np.array_equal(got, OPS[op].reference(x, yt(zy), **attrs)):
                bad.append([op, x0, span, np.dtype(yt).name])
print(json.dumps({"avx2_only": native_kernels._LIB.ivit_rescale_avx2(), "bad": bad}))
"""


@needs_native
@pytest.mark.skipif(
    QEMU_X86 is None,
    reason="needs qemu-x86_64 (apt-get install qemu-user) on an x86-64 host",
)
def test_native_kernels_exact_on_an_emulated_avx2_cpu():
    """The compiled loops run their AVX2 clones (target_clones' x86-64-v3) on an emulated Haswell (AVX2, no
    AVX-512): equal to the references there too."""
    run = haswell(EMULATED, cwd=str(Path(__file__).resolve().parents[2]))
    assert run.returncode == 0, run.stderr[-2000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result == {"avx2_only": 1, "bad": []}
