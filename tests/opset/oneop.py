"""One-node models of the private ops, run every way the project runs them, plus converter-style parameters.

``run_all_ways(spec, inputs, attrs)`` returns the results of

* ``reference``        -- the numpy reference kernel (``spec.run``), the normative definition;
* ``ort_functions``    -- the ONNX function body in stock onnxruntime;
* ``onnx_functions``   -- the same function body in ``onnx.reference.ReferenceEvaluator``;
* ``ort_library``      -- the custom-op library (onnxruntime-extensions hosting the compiled kernels);
* ``native_1t``/``native_3t`` -- the compiled kernels called directly, on 1 and 3 threads (when they take
  the call; see :mod:`ivit_onnx.opset.native_kernels`);

and, with ``evaluator=True``, ``evaluator`` -- :func:`ivit_onnx.opset.reference.evaluator`
(onnx.reference with the private ops bound to the reference kernels).

The ``*_params`` helpers turn real scales into the ops' integer parameters the way a converter does
(:func:`ivit_onnx.dyadic.dyadic`, :func:`~ivit_onnx.dyadic.multiplier_bits`,
:func:`ivit_onnx.opset.shift_exp.max_n`) and assert the op's overflow precondition.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from ivit_onnx.dyadic import dyadic, dyadic_array, multiplier_bits
from ivit_onnx.opset import OpSpec, native_kernels
from ivit_onnx.opset._body import Body
from ivit_onnx.opset.functions import attach_functions
from ivit_onnx.opset.ort_library import session
from ivit_onnx.opset.reference import evaluator as reference_evaluator
from ivit_onnx.opset.shift_exp import max_n
from ivit_onnx.qparams import poly_coefficients

OPSETS = (17, 18)
INT_DTYPES = (np.int8, np.uint8, np.int16, np.int32)
I62 = 1 << 62  # the rescale preconditions: |t| < 2**62 (the bodies' biased shift)


def info(dtype) -> tuple[int, int]:
    i = np.iinfo(dtype)
    return int(i.min), int(i.max)


# ---------------------------------------------------------------------------------------------- models


def one_node_model(spec: OpSpec, inputs, attrs: dict, opset: int = 17, feed_all: bool = False,
                   out_shape=None) -> tuple[onnx.ModelProto, dict]:
    """A checked model holding one ``spec`` node, with its function body attached, and its feeds.

    The first input is always a graph input; the others are initializers, or graph inputs too
    with ``feed_all``. Returns ``(model, feeds)``.
    """
    names = [p.name for p in spec.inputs]
    arrays = [np.asarray(v) for v in inputs]
    n_fed = len(names) if feed_all else 1
    graph_inputs = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
                    for n, a in zip(names[:n_fed], arrays[:n_fed], strict=True)]
    inits = [numpy_helper.from_array(a, n) for n, a in zip(names[n_fed:], arrays[n_fed:], strict=True)]
    out_dtype = spec.output_dtype([a.dtype for a in arrays])
    if out_shape is None:
        out_shape = np.broadcast_shapes(*(a.shape for a in arrays))
    out = helper.make_tensor_value_info("y", helper.np_dtype_to_tensor_dtype(out_dtype), out_shape)
    node = spec.make_node(names, ["y"], name=f"{spec.name}_0", **attrs)
    graph = helper.make_graph([node], f"one_{spec.name}", graph_inputs, [out], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)
    attach_functions(model)
    onnx.checker.check_model(model, full_check=True)
    feeds = {n: a for n, a in zip(names[:n_fed], arrays[:n_fed], strict=True)}
    return model, feeds


def run_all_ways(spec: OpSpec, inputs, attrs: dict, opset: int = 17, feed_all: bool = False,
                 evaluator: bool = False) -> dict[str, np.ndarray]:
    """The op's result from the reference kernel, both function-body engines and the ORT library."""
    ref = spec.run(*inputs, **attrs)
    model, feeds = one_node_model(spec, inputs, attrs, opset, feed_all, out_shape=ref.shape)
    results = {
        "reference": ref,
        "ort_functions": session(model, "functions", threads=1).run(None, feeds)[0],
        "onnx_functions": ReferenceEvaluator(model).run(None, feeds)[0],
        "ort_library": session(model, "library", threads=1).run(None, feeds)[0],
    }
    if evaluator:
        results["evaluator"] = reference_evaluator(model).run(None, feeds)[0]
    for threads in (1, 3):  # the compiled kernels directly, one chunk and several
        native_kernels.set_threads(threads)
        got = native_kernels.KERNELS[spec.name](*inputs, **attrs)
        if got is not None:
            results[f"native_{threads}t"] = got
    native_kernels.set_threads(None)
    return results


def assert_bit_exact(results: dict[str, np.ndarray]) -> np.ndarray:
    """Every result equals the reference: same dtype, same shape, same bits."""
    ref = results["reference"]
    for way, got in results.items():
        assert got.dtype == ref.dtype, f"{way}: dtype {got.dtype} != reference {ref.dtype}"
        assert got.shape == ref.shape, f"{way}: shape {got.shape} != reference {ref.shape}"
        if not np.array_equal(got, ref):
            bad = np.argwhere(got != ref)
            i = tuple(bad[0])
            raise AssertionError(f"{way}: {len(bad)} of {ref.size} elements differ from the reference, "
                                 f"first at {i}: {got[i]} != {ref[i]}")
    return ref


def check_all_ways(spec: OpSpec, inputs, attrs: dict, opset: int = 17, feed_all: bool = False,
                   evaluator: bool = False) -> np.ndarray:
    return assert_bit_exact(run_all_ways(spec, inputs, attrs, opset, feed_all, evaluator))


def run_body(build, feeds: dict, opset: int = 17) -> list[np.ndarray]:
    """Run a graph of Body nodes (``build(g, *input_names) -> output``) in onnxruntime and onnx.reference."""
    g = Body(opset)
    out = build(g, *feeds)
    i64 = TensorProto.INT64
    graph = helper.make_graph(g.nodes, "body", [helper.make_tensor_value_info(n, i64, None) for n in feeds],
                              [helper.make_tensor_value_info(out, i64, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return [sess.run(None, feeds)[0], ReferenceEvaluator(model).run(None, feeds)[0]]


# ------------------------------------------------------------------------- converter-style parameters


def requantize_params(s_x: float, s_y: float, max_abs: int, axis_scales=None):
    """``(multiplier, shift)`` for ``s_x/s_y`` (per tensor, or per channel from ``axis_scales``)."""
    bits = multiplier_bits(max_abs)
    if axis_scales is None:
        b, c = dyadic(s_x / s_y, bits)
        b, c = np.int64(b), np.int64(c)
    else:
        b, c = dyadic_array(np.asarray(axis_scales, dtype=np.float64) / s_y, bits)
    assert np.all(max_abs * np.abs(b) + (np.int64(1) << c) // 2 < I62)
    return b, c


def iadd_params(s_a, s_b, s_y: float, max_a: int, max_b: int):
    """``(ma, mb, c)`` with one shift ``c`` for both ``s_a/s_y`` and ``s_b/s_y`` (each may be per channel).

    The larger multiplier gets the widest dyadic form that keeps ``|a|*|ma| + |b|*|mb|`` in int64;
    the other is rounded onto the same ``2**-c`` grid.
    """
    m_a = np.asarray(s_a, dtype=np.float64) / s_y
    m_b = np.asarray(s_b, dtype=np.float64) / s_y
    bits = multiplier_bits(max_a + max_b)
    _, c = dyadic(float(max(m_a.max(), m_b.max())), bits)
    ma = np.round(np.ldexp(m_a, c)).astype(np.int64)
    mb = np.round(np.ldexp(m_b, c)).astype(np.int64)
    assert np.all(max_a * np.abs(ma) + max_b * np.abs(mb) + (1 << c) // 2 < I62)
    return ma, mb, np.int64(c)


def fine_grid(x, x0_real: float, min_x0: int = 1024):
    """Upscale integers exactly (``x * m``, int32) until the exp grid ``x0_real * m`` is at least ``min_x0``.

    What the converter does before Shiftmax/ShiftGELU, so that ``x0 = round(x0_real * m)`` carries the
    scale to 0.05%; returns ``(x * m, m)``.
    """
    x = np.asarray(x)
    m = max(1, math.ceil(min_x0 / x0_real))
    bound = max(1, int(np.abs(x.astype(np.int64)).max()))
    m = min(m, (2**31 - 1) // bound)
    return (x.astype(np.int64) * m).astype(np.int32) if m > 1 else x, m


def shiftmax_params(s_x: float, row: int, bits: int) -> dict:
    """Attributes of a Shiftmax on scores of scale ``s_x`` in rows of ``row``: ``x0 = round(1/s)``."""
    x0 = max(1, round(1.0 / s_x))
    n = max_n(x0, row)
    assert row * x0 * 2**n < 2**62
    return {"x0": x0, "n": n, "bits": bits}


def poly_softmax_params(s_x: float, row: int, bits: int, log_bits: int | None = None) -> dict:
    """Attributes of an IBertSoftmax (LogIntSoftmax with ``log_bits``) on scores of scale ``s_x`` in rows of
    ``row``: ``x0 = round(ln2/s)``, I-BERT's coefficients on that grid, ``n = max_n(qb**2 + qc, row)``."""
    x0 = max(1, round(math.log(2) / s_x))
    qb, qc = poly_coefficients(x0)
    n = max_n(qb * qb + qc, row)
    assert row * (qb * qb + qc) * 2**n < 2**61
    attrs = {"x0": x0, "qb": qb, "qc": qc, "n": n, "bits": bits}
    return attrs if log_bits is None else {**attrs, "log_bits": log_bits}


def shiftgelu_params(s_x: float, s_y: float, max_abs: int, bits: int, qmin: int, qmax: int,
                     per_channel=None):
    """``(attrs, multiplier, shift)`` of a ShiftGELU.

    ``x0 = round(1/(1.702 s))``, ``n = max_n(x0, 1)``, ``b/2**c ~ s / (2**bits s_y)``.
    """
    x0 = max(1, round(1.0 / (1.702 * s_x)))
    n = max_n(x0, 1)
    assert 2 * x0 * 2**n < 2**62
    bits = min(bits, 61 - 8 - int(max_abs).bit_length())  # leave the output rescale at least 8 bits
    bound = max_abs << bits
    mbits = multiplier_bits(bound)
    if per_channel is None:
        b, c = dyadic(s_x * 2.0**-bits / s_y, mbits)
        b, c = np.int64(b), np.int64(c)
    else:
        b, c = dyadic_array(s_x * 2.0**-bits / (s_y * np.asarray(per_channel, dtype=np.float64)), mbits)
    assert np.all(bound * np.abs(b) + (np.int64(1) << c) // 2 < I62)
    attrs = {"x0": x0, "n": n, "bits": bits, "qmin": qmin, "qmax": qmax}
    return attrs, b, c


def ln_shift_in(c_len: int, max_abs_d: int, cap: int = 16) -> int:
    """Largest ``shift_in <= cap`` with ``C * (max|x - mean| * 2**shift_in)**2 < 2**62``."""
    k = cap
    while k > 0 and c_len * (max_abs_d << k) ** 2 >= 2**62:
        k -= 1
    assert c_len * (max_abs_d << k) ** 2 < 2**62, "input range too wide for ILayerNorm"
    return k


def ilayernorm_params(gamma, beta, s_y: float, max_abs_d: int, qmin: int, qmax: int, p: int = 30,
                      unit: float | None = None):
    """``(attrs, multiplier, shift, bias)`` of an ILayerNorm with per-channel ``gamma``/``beta``.

    ``b/2**c ~ sqrt(C) gamma / (2**p s_y)`` (signed; ``unit`` instead of ``sqrt(C)``: L1LayerNorm's
    ``C / sqrt(pi/2)``), ``bias = round(beta/s_y * 2**c)``; each channel's multiplier width leaves room for
    its bias so ``2**p |b| + |bias| + 2**(c-1) < 2**63``; ``shift_in`` is the widest that keeps
    ``C * max|d|**2 < 2**62`` (``max_abs_d`` bounds ``|x - mean|``).
    """
    gamma = np.asarray(gamma, dtype=np.float64)
    beta = np.asarray(beta, dtype=np.float64)
    c_len = gamma.shape[-1]
    m = (math.sqrt(c_len) if unit is None else unit) * gamma / (2.0**p * s_y)
    bs, cs, biases = [], [], []
    for mi, bi in zip(m, beta / s_y, strict=True):
        # |bias| ~ |beta/s_y| * |b| / |m|: widen the bound the multiplier multiplies by that much
        bound = (1 << p) + math.ceil(abs(bi) / abs(mi)) + 1
        b, c = dyadic(mi, multiplier_bits(bound), allow_negative=True)
        bias = round(bi * 2.0**c)
        assert (1 << p) * abs(b) + abs(bias) + (1 << c) // 2 < 2**63
        bs.append(b)
        cs.append(c)
        biases.append(bias)
    shift_in = ln_shift_in(c_len, max_abs_d)
    attrs = {"shift_in": shift_in, "p": p, "qmin": qmin, "qmax": qmax}
    return attrs, np.array(bs, np.int64), np.array(cs, np.int64), np.array(biases, np.int64)


def il2norm_params(c_len: int, max_abs_d: int, s_y: float, qmin: int, qmax: int, p: int = 30,
                   per_channel=None):
    """``(attrs, multiplier, shift)`` of an IL2Norm into scale ``s_y`` (``/ per_channel`` on the last axis):
    ``b/2**c ~ 1/(2**p s_y)``, sized so ``2**p |b| + 2**(c-1) < 2**62``; ``shift_in`` as ILayerNorm's
    (``max_abs_d`` bounds ``|x - zx|``); ``eps`` 1."""
    m = 1.0 / (2.0**p * s_y) * (1.0 if per_channel is None else 1.0 / np.asarray(per_channel, np.float64))
    b, c = dyadic_array(np.atleast_1d(m), multiplier_bits(1 << p))
    if per_channel is None:
        b, c = b.reshape(()), c.reshape(())
    assert np.all((np.int64(1) << p) * np.abs(b) + (np.int64(1) << c) // 2 < I62)
    attrs = {"shift_in": ln_shift_in(c_len, max_abs_d), "eps": 1, "p": p, "qmin": qmin, "qmax": qmax}
    return attrs, b, c


# ------------------------------------------------------------ the ablation's kernels (paper Table 2)


def ibertgelu_params(s_x: float, s_y: float, max_abs: int, bits: int, qmin: int, qmax: int, per_channel=None):
    """``(attrs, multiplier, shift)`` of an IBertGELU.

    erf's grid ``s' = s/sqrt 2``: ``clip = round(1.769/s')``, ``coeff = max(round(1/(0.2888 s'**2)),
    clip**2)``, ``k`` leaving ``bits`` bits in ``D = round_shift(coeff, k)``, ``b/2**c ~ s / (2 D s_y)``.
    """
    s_erf = s_x / math.sqrt(2)
    clip = round(1.769 / s_erf)
    coeff = max(round(1 / (0.2888 * s_erf**2)), clip * clip)
    k = max(0, coeff.bit_length() - bits)
    d = (coeff + (1 << k >> 1)) >> k
    assert clip < 2**31 and coeff + 2**k < 2**62
    bound = max_abs * 2 * d
    mbits = multiplier_bits(bound)
    if per_channel is None:
        b, c = dyadic(s_x / (2 * d * s_y), mbits)
        b, c = np.int64(b), np.int64(c)
    else:
        b, c = dyadic_array(s_x / (2 * d * s_y * np.asarray(per_channel, dtype=np.float64)), mbits)
    assert np.all(bound * np.abs(b) + (np.int64(1) << c) // 2 < I62)
    return {"clip": clip, "coeff": coeff, "k": k, "qmin": qmin, "qmax": qmax}, b, c


def l1_shift_in(c_len: int, max_abs_x: int) -> int:
    """Largest ``shift_in <= 62`` with ``C * max|x| * 2**shift_in < 2**61`` (L1LayerNorm's precondition)."""
    k = 62
    while k > 0 and c_len * max(max_abs_x, 1) << k >= 2**61:
        k -= 1
    assert c_len * max(max_abs_x, 1) << k < 2**61, "input range too wide for L1LayerNorm"
    return k
