"""Unary functions of a quantized tensor (passes/rules/unary.py, passes/rules/lookup.py): Relu / Neg / Abs /
float Clip as exact integer clamps, the smooth functions as exact tables, on every input value; int32
accumulators through integer ops within one output step; a non-saturating function of one declines."""

from __future__ import annotations

import numpy as np
import pytest

from tests.graphs import G, op_counts, run
from tests.passes._rules import backends_agree, declines, lowered

ZPS = [(np.int8, 0), (np.uint8, 128), (np.uint8, 37)]
CLAMP = "integer clamp (Requantize)"
TABLE = "table lookup (Gather)"


def _graph(op, dtype, zp, out_scale, out_zp=None, extra=(), opset=17, **attrs):
    g = G(opset)
    x = g.qdq(g.input("x", [2, 8, 16]), 0.03, zp, dtype)
    y = g.node(op, [x, *(g.const(v) for v in extra)], **attrs)
    g.output(g.qdq(y, out_scale, zp if out_zp is None else out_zp, dtype) if out_scale else y)
    return g.model()


def _feeds(zp, dtype=np.int8):
    """Every value ``q`` of ``dtype`` once, as the input ``(q - zp) 0.03``."""
    q = np.arange(np.iinfo(dtype).min, np.iinfo(dtype).max + 1, dtype=np.float32)
    return {"x": ((q - zp) * np.float32(0.03)).reshape(2, 8, 16)}


@pytest.mark.parametrize("dtype, zp", ZPS)
@pytest.mark.parametrize(
    "op, extra, same_type_kind",
    [("Relu", (), CLAMP), ("Neg", (), CLAMP), ("Clip", (-0.5, 0.8), CLAMP), ("Clip", (-0.465, 0.495), CLAMP)],
    ids=["relu", "neg", "clip", "clip_ties"],
)
def test_clamps_into_the_input_type_are_one_exact_requantize(op, extra, same_type_kind, dtype, zp):
    """Output quantized like the input: Relu / Clip a Requantize clamp (bounds rounded onto the grid half to
    even, as the QuantizeLinear: -0.465 and 0.495 are float32 ties at -15.5 and 16.5 steps), Neg a Requantize
    by -1 (int8 -128 saturates to 127, as Q(128 s) does); every input value equal to the fake-quant model."""
    out_zp = zp if op != "Neg" or dtype == np.int8 else 255 - zp
    fq = _graph(op, dtype, zp, 0.03, out_zp, extra)
    out, report = lowered(fq, _feeds(zp, dtype), atol=0)
    assert report.counts["lower_integer"][f"{op} → {same_type_kind}"] == 1
    assert op_counts(out).get("ai.ivit:Requantize") == 1 and "Gather" not in op_counts(out)
    backends_agree(out, _feeds(zp, dtype))  # a narrowed qmin/qmax, a multiplier of -1


@pytest.mark.parametrize("dtype, zp", ZPS)
@pytest.mark.parametrize(
    "op, extra, attrs",
    [
        ("Relu", (), {}),
        ("Neg", (), {}),
        ("Abs", (), {}),
        ("Clip", (-0.5, 0.8), {}),
        ("LeakyRelu", (), {"alpha": 0.1}),
        ("HardSigmoid", (), {}),
        ("HardSwish", (), {}),
        ("Softplus", (), {}),
        ("Softsign", (), {}),
        ("Elu", (), {"alpha": 0.7}),
        ("Selu", (), {}),
        ("Celu", (), {"alpha": 1.3}),
        ("Erf", (), {}),
        ("Mish", (), {}),
        ("ThresholdedRelu", (), {"alpha": 0.5}),
        ("Tanh", (), {}),
        ("Sigmoid", (), {}),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_functions_into_another_type_are_exact_tables(op, extra, attrs, dtype, zp):
    """Output scale 0.017 (not the input's): ``Q(f(DQ(q)))`` as a 256-entry table, equal on every input."""
    fq = _graph(op, dtype, zp, 0.017, extra=extra, opset=18, **attrs)
    out, report = lowered(fq, _feeds(zp, dtype), atol=0)
    assert report.counts["lower_integer"][f"{op} → {TABLE}"] == 1
    assert op_counts(out).get("Gather") == 1 and op not in op_counts(out)


@pytest.mark.parametrize("dtype, zp", ZPS)
@pytest.mark.parametrize("op", ["Relu", "Neg", "Abs"])
def test_without_a_quantize_after_it_the_input_scale_is_kept_exactly(op, dtype, zp):
    """A graph output right after the op: Relu in the input's type, Neg with the mirrored zero point
    (int8 -128 -> +128 s, no saturation), Abs in int32; the float values equal the fake-quant model's."""
    fq = _graph(op, dtype, zp, None)
    feeds = _feeds(zp, dtype)
    out, report = lowered(fq, feeds, atol=0)
    if op == "Neg":
        ref = run(fq, feeds)[0]
        assert np.max(ref) == pytest.approx((zp - np.iinfo(dtype).min) * 0.03, rel=1e-6)  # the extreme
    assert op not in op_counts(out) or op == "Abs"  # Abs: the int32 standard op
    backends_agree(out, feeds)


def test_float_clip_without_a_quantize_after_it_rounds_its_bounds_onto_the_grid():
    """The bounds -0.5 and 0.8 are off the 0.03 grid: the clamp is at the nearest grid points, so the output
    is within half an input step of the float Clip."""
    fq = _graph("Clip", np.int8, 0, None, extra=(-0.5, 0.8))
    out, _ = lowered(fq, _feeds(0), atol=0.015 + 1e-6)
    got = run(out, _feeds(0))[0]
    assert np.min(got) == pytest.approx(-17 * 0.03) and np.max(got) == pytest.approx(27 * 0.03)


def test_sixteen_bit_input_is_an_exact_65536_entry_table():
    """An int16 input (QDQ at opset 21) through HardSwish into int8: every int16 value, one table."""
    g = G(opset=21)
    x = g.qdq(g.input("x", [2, 256, 128]), 0.001, 0, np.int16)
    g.output(g.qdq(g.node("HardSwish", [x]), 0.05))
    fq = g.model()
    feeds = {"x": (np.arange(-32768, 32768, dtype=np.float32) * 0.001).reshape(2, 256, 128)}
    out, report = lowered(fq, feeds, atol=0)
    assert report.counts["lower_integer"][f"HardSwish → {TABLE}"] == 1


@pytest.mark.parametrize("op", ["Relu", "Neg", "Abs", "Clip", "HardSigmoid", "Erf"])
def test_int32_accumulator_input_within_one_output_step(op):
    """A MatMul's int32 accumulator (no QuantizeLinear between): Relu / Clip / Neg / Abs as integer ops and
    one Requantize, HardSigmoid / Erf through the saturating int16 table; within one output step."""
    g = G()
    x = g.qdq(g.input("x", [2, 6, 16]), 0.03)
    w = np.random.default_rng(3).standard_normal((16, 8)).astype(np.float32) * 0.3
    acc = g.node("MatMul", [x, g.weight(w, axis=1)])
    extra = [g.const(-0.4), g.const(0.9)] if op == "Clip" else []
    g.output(g.qdq(g.node(op, [acc, *extra]), 0.02))
    xs = (np.random.default_rng(4).standard_normal((2, 6, 16)) * 2).astype(np.float32)
    out, report = lowered(g.model(), {"x": xs}, atol=0.02 * (1 + 1e-6))
    kind = TABLE if op in ("HardSigmoid", "Erf") else "integer Abs" if op == "Abs" else CLAMP
    assert report.counts["lower_integer"][f"{op} → {kind}"] == 1
    backends_agree(out, {"x": xs})


@pytest.mark.parametrize("op", ["Elu", "HardSwish", "Softplus"])
def test_non_saturating_function_of_an_accumulator_declines(op):
    g = G()
    x = g.qdq(g.input("x", [2, 6, 16]), 0.03)
    acc = g.node("MatMul", [x, g.weight(np.random.default_rng(3).standard_normal((16, 8)), axis=1)])
    g.output(g.qdq(g.node(op, [acc]), 0.02))
    declines(g.model(), op, f"{op} does not saturate: no finite table covers it")


def test_clip_with_a_tensor_bound_declines():
    g = G()
    x = g.qdq(g.input("x", [2, 8, 16]), 0.03)
    hi = g.node("ReduceMax", [x], keepdims=0)
    g.output(g.qdq(g.node("Clip", [x, g.const(0.0), hi]), 0.03))
    declines(g.model(), "Clip", "is not a float constant scalar")


@pytest.mark.parametrize("dtype, zp", ZPS)
@pytest.mark.parametrize("alpha", [0.25, -0.375, 1.5])
def test_leaky_relu_with_nothing_quantized_after_it_is_exact_integer_ops(alpha, dtype, zp):
    """``alpha = m / 2**k``: ``m (q - zx) + (2**k - m) relu(q - zx)`` at scale ``s / 2**k``, the fake-quant
    real values exactly (a negative slope and one above 1 included): equal to the fake-quant float32 values up
    to their own rounding of ``alpha * x`` (none for a power of two)."""
    fq = _graph("LeakyRelu", dtype, zp, None, alpha=alpha)
    out, report = lowered(fq, _feeds(zp, dtype), atol=0 if alpha == 0.25 else 1e-6)
    assert report.counts["lower_integer"]["LeakyRelu → integer LeakyRelu (dyadic slope)"] == 1
    backends_agree(out, _feeds(zp, dtype))


def _leaky_of_accumulator(alpha):
    g = G()
    x = g.qdq(g.input("x", [2, 6, 16]), 0.03)
    acc = g.node("MatMul", [x, g.weight(np.random.default_rng(3).standard_normal((16, 8)) * 0.3, axis=1)])
    g.output(g.qdq(g.node("LeakyRelu", [acc], alpha=alpha), 0.02))
    return g.model()


def test_leaky_relu_of_an_accumulator_with_a_short_slope_within_one_output_step():
    xs = (np.random.default_rng(4).standard_normal((2, 6, 16)) * 2).astype(np.float32)
    out, report = lowered(_leaky_of_accumulator(0.125), {"x": xs}, atol=0.02 * (1 + 1e-6))
    assert report.counts["lower_integer"]["LeakyRelu → integer LeakyRelu (dyadic slope)"] == 1


def test_leaky_relu_of_an_accumulator_with_a_long_slope_declines():
    """float32 0.01 is 5368709 / 2**29: times an int32 accumulator it overflows int32."""
    declines(
        _leaky_of_accumulator(0.01), "LeakyRelu", "alpha = 5368709/2**29: 2**k LeakyRelu(x) may exceed int32"
    )


@pytest.mark.slow
@pytest.mark.tvm
def test_tvm_engine_gives_the_same_bits():
    """The new integer forms in one graph (clamps with a narrowed range and a multiplier of -1, Abs,
    LeakyRelu's two Requantizes, a table, signed per-element product multipliers, an int32 product) through
    the TVM engine (llvm): the library's bits."""
    pytest.importorskip("tvm")
    from ivit_onnx.engines.tvm import compile_model
    from ivit_onnx.engines.tvm import run as tvm_run
    from ivit_onnx.runners import make_runner

    g = G()
    x = g.qdq(g.input("x", [2, 8, 16]), 0.03, 37, np.uint8)
    ys = [
        g.qdq(g.node("Relu", [x]), 0.03, 37, np.uint8),
        g.qdq(g.node("Neg", [x]), 0.03, 255 - 37, np.uint8),
        g.node("Abs", [x]),
        g.node("LeakyRelu", [x], alpha=-0.375),
        g.qdq(g.node("HardSwish", [x]), 0.02),
        g.qdq(g.node("Mul", [x, g.const(np.linspace(-1, 1, 16))]), 0.02),
        g.qdq(g.node("Mul", [x, g.qdq(g.node("Sigmoid", [x]), 1 / 255, 0, np.uint8)]), 0.02),
    ]
    for y in ys:
        g.output(y)
    out, _ = lowered(g.model(), _feeds(37, np.uint8), atol=0.02 * (1 + 1e-6))
    feeds = _feeds(37, np.uint8)
    got, ref = tvm_run(compile_model(out), feeds), make_runner("library", out).run(feeds)
    assert len(got) == len(ys) and all(np.array_equal(a, b) for a, b in zip(got, ref.values(), strict=True))
