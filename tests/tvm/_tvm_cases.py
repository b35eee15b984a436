"""Random inputs within each private op's preconditions (extremes included), and one-node models of them."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ivit_onnx.opset import OPS
from ivit_onnx.opset.functions import attach_functions
from ivit_onnx.opset.shift_exp import max_n
from ivit_onnx.qparams import poly_coefficients

INT_TYPES = (np.int8, np.uint8, np.int16, np.int32)
#: the PTX wmma multiply of 8-bit operands, by operand dtype (the CUDA tests look for it)
WMMA = {"uint8": "wmma.mma.sync.aligned.row.col.m16n16k16.s32.u8.u8.s32",
        "int8": "wmma.mma.sync.aligned.row.col.m16n16k16.s32.s8.s8.s32"}


def _info(dt) -> tuple[int, int, int]:
    i = np.iinfo(dt)
    return int(i.min), int(i.max), i.bits


def _tensor(rng, shape, dt, lo=None, hi=None) -> np.ndarray:
    """Random values of ``dt`` in [lo, hi], with the extremes planted in the first and last places."""
    dmin, dmax, _ = _info(dt)
    lo, hi = dmin if lo is None else lo, dmax if hi is None else hi
    x = rng.integers(lo, hi, size=shape, endpoint=True, dtype=np.int64)
    flat = x.reshape(-1)
    flat[0], flat[-1] = lo, hi
    return x.astype(dt)


def _scalar(rng, dt, lo=None, hi=None) -> np.ndarray:
    dmin, dmax, _ = _info(dt)
    return np.array(rng.integers(dmin if lo is None else lo, (dmax if hi is None else hi) + 1), dtype=dt)


def _mult(rng, shape, bound: int, signed: bool = True) -> np.ndarray:
    """int64 multipliers with |b| <= bound (sign random when ``signed``)."""
    b = rng.integers(0, bound, size=shape, endpoint=True, dtype=np.int64)
    if signed:
        b = b * rng.choice(np.array([-1, 1], np.int64), size=shape)
    return b


def _qrange(dt) -> dict:
    lo, hi, _ = _info(dt)
    return {"qmin": lo, "qmax": hi}


def requantize(rng, shape):
    xt, yt = rng.choice(INT_TYPES), rng.choice(INT_TYPES)
    x, zx = _tensor(rng, shape, xt), _scalar(rng, xt)
    xbits = _info(xt)[2] + 1  # |x - zx| < 2**xbits
    per_channel = rng.random() < 0.5
    mshape = (shape[-1],) if per_channel else ()
    c = rng.integers(0, 63, size=mshape, dtype=np.int64)
    b = _mult(rng, mshape, 2 ** (61 - xbits))
    return [x, zx, b, c, _scalar(rng, yt)], _qrange(yt)


def iadd(rng, shape):
    at, bt, yt = rng.choice(INT_TYPES), rng.choice(INT_TYPES), rng.choice(INT_TYPES)
    a, b = _tensor(rng, shape, at), _tensor(rng, shape[-1:], bt)
    za, zb = _scalar(rng, at), _scalar(rng, bt)
    bound = 2 ** (60 - max(_info(at)[2], _info(bt)[2]) - 1)
    return [a, b, za, zb, _mult(rng, (), bound), _mult(rng, (), bound), np.int64(rng.integers(0, 63)),
            _scalar(rng, yt)], _qrange(yt)


def _softmax_out(rng):
    yt = rng.choice(INT_TYPES)
    lo, hi, bits_t = _info(yt)
    bits = int(rng.integers(1, min(bits_t - (1 if lo < 0 else 0), 30) + 1))
    zy = _scalar(rng, yt, lo, hi - (2**bits - 1))
    return yt, bits, zy


def shiftmax(rng, shape):
    xt = rng.choice(INT_TYPES)
    x = _tensor(rng, shape, xt)
    x0 = int(rng.choice([1, 2, 7, 100, 2**10, 2**14, 2**20]))
    n = int(rng.integers(0, max_n(x0, shape[-1]) + 1))
    _, bits, zy = _softmax_out(rng)
    return [x, zy], {"x0": x0, "n": n, "bits": bits}


def shiftgelu(rng, shape):
    xt, yt = rng.choice(INT_TYPES), rng.choice(INT_TYPES)
    x = _tensor(rng, shape, xt)
    x0 = int(rng.choice([1, 3, 100, 2**10, 2**14, 2**20]))
    n = int(rng.integers(0, min(30, 60 - x0.bit_length()) + 1))
    bits = int(rng.integers(1, 31))
    mbits = 61 - _info(xt)[2] - bits  # |x| * 2**bits * |b| + 2**(c-1) < 2**63
    b = _mult(rng, (), 2 ** max(mbits, 0))
    c = np.int64(rng.integers(0, 63))
    return [x, b, c, _scalar(rng, yt)], {"x0": x0, "n": n, "bits": bits, **_qrange(yt)}


def ilayernorm(rng, shape):
    xt, yt = rng.choice((np.int8, np.uint8, np.int16)), rng.choice(INT_TYPES)
    x = _tensor(rng, shape, xt)
    ch = shape[-1]
    xbits = _info(xt)[2] + 1
    shift_in = int(rng.integers(0, max(0, (61 - ch.bit_length()) // 2 - xbits) + 1))
    p = int(rng.integers(0, 40))
    b = _mult(rng, (ch,), 2 ** (61 - p - 1))
    c = rng.integers(0, 63, size=(ch,), dtype=np.int64)
    bias = _mult(rng, (ch,), 2**60)
    return [x, b, c, bias, _scalar(rng, yt)], {"shift_in": shift_in, "p": p, **_qrange(yt)}


def ibertgelu(rng, shape):
    xt, yt = rng.choice(INT_TYPES), rng.choice(INT_TYPES)
    x = _tensor(rng, shape, xt)
    clip = int(rng.choice([0, 1, 3, 50, 1051, 25000, 2**20]))
    coeff = clip * clip + int(rng.integers(0, clip * clip // 4 + 2))
    k = int(rng.integers(0, coeff.bit_length() + 1))
    lo, hi, xbits = _info(xt)
    flat = x.reshape(-1)
    flat[1 : min(flat.size, 5)] = np.clip([clip - 1, clip, -clip, -clip - 1], lo, hi)[: max(flat.size - 1, 0)]
    d2 = 2 * ((coeff + (1 << k >> 1)) >> k)  # |x| * 2D * |b| + 2**(c-1) < 2**62
    b = _mult(rng, (shape[-1],) if rng.random() < 0.5 else (), 2 ** max(60 - xbits - d2.bit_length(), 0))
    c = np.int64(rng.integers(0, 63))
    return [x, b, c, _scalar(rng, yt)], {"clip": clip, "coeff": coeff, "k": k, **_qrange(yt)}


def l1layernorm(rng, shape):
    xt, yt = rng.choice(INT_TYPES), rng.choice(INT_TYPES)
    x = _tensor(rng, shape, xt)
    ch = shape[-1]
    xbits = _info(xt)[2]  # |x| <= 2**xbits: C * max|x| * 2**shift_in < 2**61
    shift_in = int(rng.integers(0, 60 - ch.bit_length() - xbits + 1))
    p = int(rng.integers(0, 40))
    b = _mult(rng, (ch,), 2 ** (61 - p - 1))
    c = rng.integers(0, 63, size=(ch,), dtype=np.int64)
    bias = _mult(rng, (ch,), 2**60)
    return [x, b, c, bias, _scalar(rng, yt)], {"shift_in": shift_in, "p": p, **_qrange(yt)}


def il2norm(rng, shape):
    xt, yt = rng.choice(INT_TYPES), rng.choice(INT_TYPES)
    ch = shape[-1]
    if xt == np.int32:  # C * max|x - zx|**2 < 2**62: an accumulator's known range
        x, zx = _tensor(rng, shape, xt, -(2**20), 2**20 - 1), _scalar(rng, xt, -(2**20), 2**20 - 1)
        xbits = 22
    else:
        x, zx = _tensor(rng, shape, xt), _scalar(rng, xt)
        xbits = _info(xt)[2] + 1
    x.reshape(-1)[: max(1, x.size // 4)] = zx  # a zero row where the row is short
    shift_in = int(rng.integers(0, max(0, (61 - ch.bit_length()) // 2 - xbits) + 1))
    eps = int(rng.choice([1, 1 << shift_in, 2**40, 2**62 - 1]))
    p = int(rng.integers(0, 40))
    b = _mult(rng, (ch,) if rng.random() < 0.5 else (), 2 ** (61 - p - 1))
    c = np.int64(rng.integers(0, 63))
    return [x, zx, b, c, _scalar(rng, yt)], {"shift_in": shift_in, "eps": eps, "p": p, **_qrange(yt)}


def poly_softmax(op: str):
    """IBertSoftmax / LogIntSoftmax: I-BERT's coefficients on grids from 1 to past the converter's, any ``n``
    within the row's overflow bound, Shiftmax's outputs; LogIntSoftmax with 1..5 level bits."""

    def gen(rng, shape):
        x = _tensor(rng, shape, rng.choice(INT_TYPES))
        x0 = int(rng.choice([1, 2, 7, 100, 2**10, 2**11, 2**14]))
        qb, qc = poly_coefficients(x0)
        n = int(rng.integers(0, max_n(qb * qb + qc, shape[-1]) + 1))
        _, bits, zy = _softmax_out(rng)
        attrs = {"x0": x0, "qb": qb, "qc": qc, "n": n, "bits": bits}
        if op == "LogIntSoftmax":
            attrs["log_bits"] = int(rng.integers(1, 6))
        return [x, zy], attrs

    return gen


GENERATORS = {"Requantize": requantize, "IAdd": iadd, "Shiftmax": shiftmax, "ShiftGELU": shiftgelu,
              "ILayerNorm": ilayernorm, "IBertGELU": ibertgelu, "L1LayerNorm": l1layernorm,
              "IBertSoftmax": poly_softmax("IBertSoftmax"), "LogIntSoftmax": poly_softmax("LogIntSoftmax"),
              "IL2Norm": il2norm}


def one_node_model(op: str, inputs: list, attrs: dict, opset: int = 17,
                   runtime: bool = False) -> onnx.ModelProto:
    """A model holding one ``ai.ivit`` node; the first input (all inputs with ``runtime``) is a graph input,
    the rest are initializers."""
    spec = OPS[op]
    names = [p.name for p in spec.inputs]
    n_in = len(names) if runtime else 1
    arrs = [np.asarray(v) for v in inputs]
    vis = [helper.make_tensor_value_info(nm, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
           for nm, a in zip(names[:n_in], arrs[:n_in], strict=True)]
    inits = [numpy_helper.from_array(a, nm) for nm, a in zip(names[n_in:], arrs[n_in:], strict=True)]
    out_dt = helper.np_dtype_to_tensor_dtype(spec.output_dtype([np.asarray(v).dtype for v in inputs]))
    out_shape = np.broadcast_shapes(arrs[0].shape, arrs[1].shape) if op == "IAdd" else arrs[0].shape
    graph = helper.make_graph([spec.make_node(names, ["y"], name="n0", **attrs)], op, vis,
                              [helper.make_tensor_value_info("y", out_dt, out_shape)], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)
    return attach_functions(model)


def feeds(model: onnx.ModelProto, inputs: list) -> dict:
    return {vi.name: np.asarray(v) for vi, v in zip(model.graph.input, inputs, strict=False)}


def batch_model(op: str, cases: list[tuple[list, dict]], opset: int = 17,
                runtime: bool = False) -> onnx.ModelProto:
    """Independent one-node cases of ``op`` in one model (one compile checks them all); names get ``_i``."""
    spec = OPS[op]
    names = [p.name for p in spec.inputs]
    nodes, vis, inits, outs = [], [], [], []
    n_in = len(names) if runtime else 1
    for i, (inputs, attrs) in enumerate(cases):
        arrs = [np.asarray(v) for v in inputs]
        nm = [f"{n}_{i}" for n in names]
        vis += [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
                for n, a in zip(nm[:n_in], arrs[:n_in], strict=True)]
        inits += [numpy_helper.from_array(a, n) for n, a in zip(nm[n_in:], arrs[n_in:], strict=True)]
        shape = np.broadcast_shapes(arrs[0].shape, arrs[1].shape) if op == "IAdd" else arrs[0].shape
        out_dt = helper.np_dtype_to_tensor_dtype(spec.output_dtype([a.dtype for a in arrs]))
        outs.append(helper.make_tensor_value_info(f"y_{i}", out_dt, shape))
        nodes.append(spec.make_node(nm, [f"y_{i}"], name=f"n{i}", **attrs))
    graph = helper.make_graph(nodes, f"{op}_batch", vis, outs, initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)
    return attach_functions(model)


def batch_feeds(cases: list[tuple[list, dict]], runtime: bool = False) -> list[np.ndarray]:
    """Graph inputs of :func:`batch_model`, in order."""
    return [np.asarray(v) for inputs, _ in cases for v in (inputs if runtime else inputs[:1])]


def chain_model(rng, tokens: int = 8, dim: int = 16, hidden: int = 32, opset: int = 17) -> onnx.ModelProto:
    """A small integer block: MatMulInteger + Add(int32 bias) -> Requantize -> ShiftGELU -> MatMulInteger
    -> Shiftmax / ILayerNorm -> IAdd (int16 residual); outputs the residual and the softmax."""
    i8, i64 = np.int8, np.int64
    w1 = rng.integers(-128, 128, (dim, hidden)).astype(i8)
    w2 = rng.integers(-128, 128, (hidden, hidden)).astype(i8)
    consts = {
        "w1": w1, "x_zp": np.uint8(128), "bias1": rng.integers(-2**14, 2**14, hidden).astype(np.int32),
        "w2": w2, "w2_zp": np.arange(hidden).astype(i8) % 5 - 2,
        "i32_zp": np.int32(0), "i8_zp": np.int8(0), "u8_zp": np.uint8(0), "i16_zp": np.int16(3),
        "rq_m": rng.integers(1 << 20, 1 << 21, hidden).astype(i64), "rq_c": np.full(hidden, 28, i64),
        "g_m": np.int64(1 << 18), "g_c": np.int64(26),
        "ln_m": rng.integers(-(1 << 20), 1 << 20, hidden).astype(i64), "ln_c": np.full(hidden, 36, i64),
        "ln_b": rng.integers(-(1 << 40), 1 << 40, hidden).astype(i64),
        "a_m": np.int64(3 << 28), "b_m": np.int64(5 << 27), "ab_c": np.int64(31),
    }
    ops = OPS
    nodes = [
        helper.make_node("MatMulInteger", ["x", "w1", "x_zp"], ["acc1"], name="mm1"),
        helper.make_node("Add", ["acc1", "bias1"], ["acc1b"], name="bias1"),
        ops["Requantize"].make_node(["acc1b", "i32_zp", "rq_m", "rq_c", "i8_zp"], ["q1"], name="rq1",
                                    qmin=-128, qmax=127),
        ops["ShiftGELU"].make_node(["q1", "g_m", "g_c", "i8_zp"], ["g1"], name="gelu", x0=30, n=20, bits=8,
                                   qmin=-128, qmax=127),
        helper.make_node("MatMulInteger", ["g1", "w2", "", "w2_zp"], ["acc2"], name="mm2"),
        ops["Shiftmax"].make_node(["acc2", "u8_zp"], ["probs"], name="softmax", x0=2**14, n=20, bits=8),
        ops["ILayerNorm"].make_node(["acc2", "ln_m", "ln_c", "ln_b", "i8_zp"], ["ln"], name="ln",
                                    shift_in=0, p=24, qmin=-128, qmax=127),
        ops["IAdd"].make_node(["ln", "q1", "i8_zp", "i8_zp", "a_m", "b_m", "ab_c", "i16_zp"], ["res"],
                              name="res", qmin=-32768, qmax=32767),
    ]
    graph = helper.make_graph(
        nodes, "chain", [helper.make_tensor_value_info("x", onnx.TensorProto.UINT8, [2, tokens, dim])],
        [helper.make_tensor_value_info("res", onnx.TensorProto.INT16, [2, tokens, hidden]),
         helper.make_tensor_value_info("probs", onnx.TensorProto.UINT8, [2, tokens, hidden])],
        initializer=[numpy_helper.from_array(np.asarray(v), k) for k, v in consts.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)
    return attach_functions(model)
