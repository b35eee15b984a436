"""Attention's activation x activation GEMMs on the library's own kernel (``opset/native/qbatch_op.cpp``, ops
``ai.ivit.engine`` QBatchMatMul / QBatchMatMulRequantize / QBatchMatMulTable), bit for bit against numpy:
MatMulInteger's int32 accumulator (wrapping as an int32 matmul does), then the Requantize reference (and the
table).

Cases: every signedness pair of A and B, K in (1, 7, 64, 197, 1031), operands at -128 / 127 / 255, zero
points at their extremes and absent, MatMul's batch broadcasting (rank 2 to 4), B given transposed
(``trans_b``), per-tensor and per-column Requantize parameters, 1 and 2 threads, few and many GEMMs, each
instruction-set path this CPU has (``IVIT_GEMM_ISA``); head views of [B, S, C] operands and a merged output.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from ivit_onnx.opset import native_kernels
from ivit_onnx.opset.requantize import reference as requantize
from tests.opset.test_qgemm import ISAS, need, ort_run

pytestmark = pytest.mark.skipif(not native_kernels.available(), reason="native library not built")
DOMAIN = "ai.ivit.engine"
DTYPES = (np.int8, np.uint8)


def operand(rng, dt, shape, extremes=True) -> np.ndarray:
    info = np.iinfo(dt)
    x = rng.integers(info.min, info.max + 1, shape).astype(dt)
    if extremes:
        x[rng.random(shape) < 0.3] = info.min
        x[rng.random(shape) < 0.3] = info.max
    return x


def accumulate(a, b, za, zb) -> np.ndarray:
    """MatMulInteger: (a - za) @ (b - zb) with an int32 accumulator that wraps."""
    return ((a.astype(np.int64) - za) @ (b.astype(np.int64) - zb)).astype(np.int32)


def batch_model(a, b, za, zb, trans_b=False, rq=None, table=None) -> tuple[onnx.ModelProto, dict]:
    """One QBatchMatMul[Requantize|Table] node; A and B graph inputs, the rest initializers (None: absent)."""
    inits, names = [], ["a", "b"]
    for key, v in (("za", za), ("zb", zb)):
        names.append(key if v is not None else "")
        if v is not None:
            inits.append(numpy_helper.from_array(np.asarray(v), key))
    op, attrs, out_dt = "QBatchMatMul", {}, np.dtype(np.int32)
    if rq is not None:
        for key in ("zx", "mult", "shift", "zy"):
            inits.append(numpy_helper.from_array(np.asarray(rq[key]), key))
            names.append(key)
        op, attrs, out_dt = (
            "QBatchMatMulRequantize",
            {"qmin": rq["qmin"], "qmax": rq["qmax"]},
            np.asarray(rq["zy"]).dtype,
        )
        if table is not None:
            inits.append(numpy_helper.from_array(table, "table"))
            names.append("table")
            op, out_dt = "QBatchMatMulTable", table.dtype
    if trans_b:
        attrs["trans_b"] = 1
    elem = helper.np_dtype_to_tensor_dtype
    node = helper.make_node(op, names, ["y"], domain=DOMAIN, name="bmm", **attrs)
    graph = helper.make_graph(
        [node],
        "qbatch",
        [
            helper.make_tensor_value_info("a", elem(a.dtype), a.shape),
            helper.make_tensor_value_info("b", elem(b.dtype), b.shape),
        ],
        [helper.make_tensor_value_info("y", elem(out_dt), None)],
        inits,
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(DOMAIN, 1)], ir_version=10
    )
    return model, {"a": a, "b": b}


def requant_params(rng, n, per_column, out=np.uint8) -> dict:
    size = n if per_column else 1
    o = np.iinfo(out)
    return {
        "zx": rng.integers(-(1 << 16), 1 << 16, size).astype(np.int32),
        "mult": (rng.integers(1, 1 << 30, size) * rng.choice([-1, 1], size)).astype(np.int64),
        "shift": rng.integers(20, 45, size).astype(np.int64),
        "zy": out(rng.integers(o.min, o.max + 1)),
        "qmin": int(o.min),
        "qmax": int(o.max),
    }


def zero_point(rng, dt, extreme):
    info = np.iinfo(dt)
    return dt(info.max if extreme else rng.integers(info.min, info.max + 1))


@pytest.mark.parametrize("adt", DTYPES)
@pytest.mark.parametrize("bdt", DTYPES)
def test_int32_every_signedness_and_k(adt, bdt):
    """The int32 form equals MatMulInteger for each K (1, odd, prime, large), zero points absent, at an
    extreme and random; one GEMM per batch entry of a 4-D pair."""
    rng = np.random.default_rng(7)
    for k in (1, 7, 64, 197, 1031):
        for zps in ("absent", "extreme", "random"):
            a, b = operand(rng, adt, (2, 3, 5, k)), operand(rng, bdt, (2, 3, k, 11))
            za = None if zps == "absent" else zero_point(rng, adt, zps == "extreme")
            zb = None if zps == "absent" else zero_point(rng, bdt, zps == "extreme")
            model, feeds = batch_model(a, b, za, zb)
            want = accumulate(a, b, za or 0, zb or 0)
            np.testing.assert_array_equal(ort_run(model, feeds), want, err_msg=f"K={k} {zps}")


def test_broadcast_transposed_and_threads():
    """MatMul's batch broadcasting (rank 2 against 4, 1 against n on either side) and 1-D promotion, B
    transposed (K within and past one transposed block of 64), 1 and 2 threads, fewer and more GEMMs than the
    split over GEMMs takes."""
    rng = np.random.default_rng(11)
    shapes = [
        ((3, 9, 16), (16, 13)),
        ((2, 1, 9, 16), (3, 16, 13)),
        ((1, 3, 9, 16), (4, 1, 16, 13)),
        ((9, 16), (2, 3, 16, 13)),
        ((8, 3, 50, 64), (8, 3, 64, 50)),
        ((2, 3, 21, 197), (2, 3, 197, 61)),  # K past one 64-byte block, odd; rows read in place past K
        ((16,), (2, 16, 13)),
        ((3, 9, 16), (16,)),
    ]
    for sa, sb in shapes:
        a, b = operand(rng, np.uint8, sa), operand(rng, np.uint8, sb)
        za, zb = np.uint8(128), np.uint8(3)
        want = accumulate(a, b, za, zb)
        for trans in (False, True) if len(sb) > 1 else (False,):
            model, feeds = batch_model(
                a, np.ascontiguousarray(np.swapaxes(b, -1, -2)) if trans else b, za, zb, trans_b=trans
            )
            for threads in (1, 2):
                np.testing.assert_array_equal(
                    ort_run(model, feeds, threads), want, err_msg=f"{sa} {sb} {trans}"
                )


@pytest.mark.parametrize("isa", ISAS)
def test_requantize_and_table_on_every_path(isa, monkeypatch):
    """The fused forms equal MatMulInteger -> Requantize (-> table), per tensor and per column, on each
    instruction-set path this CPU has."""
    need(isa)
    monkeypatch.setenv("IVIT_GEMM_ISA", isa)
    rng = np.random.default_rng(ISAS[isa])
    for adt, bdt, k, per_column in (
        (np.uint8, np.uint8, 197, False),
        (np.int8, np.uint8, 64, True),
        (np.uint8, np.int8, 7, True),
        (np.int8, np.int8, 1, False),
    ):
        a, b = operand(rng, adt, (2, 3, 13, k)), operand(rng, bdt, (2, 3, k, 19))
        za, zb = zero_point(rng, adt, False), zero_point(rng, bdt, True)
        acc = accumulate(a, b, za, zb)
        np.testing.assert_array_equal(ort_run(*batch_model(a, b, za, zb)), acc)
        for out in (np.uint8, np.int8):
            rq = requant_params(rng, 19, per_column, out)
            y = requantize(acc, rq["zx"], rq["mult"], rq["shift"], rq["zy"], qmin=rq["qmin"], qmax=rq["qmax"])
            np.testing.assert_array_equal(ort_run(*batch_model(a, b, za, zb, rq=rq), 2), y)
            table = rng.integers(-(1 << 15), 1 << 15, rq["qmax"] - rq["qmin"] + 1).astype(np.int16)
            model, feeds = batch_model(a, b, za, zb, rq=rq, table=table)
            np.testing.assert_array_equal(ort_run(model, feeds), table[y.astype(np.int64) - rq["qmin"]])


def with_views(model: onnx.ModelProto, **attrs) -> onnx.ModelProto:
    """The same node with head-view attributes added (qbatch_op.cpp's a_*, b_*, y_heads, y_seq)."""
    node = model.graph.node[0]
    node.attribute.extend(helper.make_attribute(k, v) for k, v in attrs.items())
    for vi in model.graph.input:  # the views' sources are given as they are, any shape
        vi.type.tensor_type.ClearField("shape")
    return model


@pytest.mark.parametrize("isa", ISAS)
def test_head_views_on_every_path(isa, monkeypatch):
    """A and B read as head views of [B, S, C] activations (packed qkv at channel offsets, B as given and
    transposed, K a multiple of 16 and odd) and the output's heads merged into its columns equal the same
    GEMMs on the copies, on each instruction-set path this CPU has."""
    need(isa)
    monkeypatch.setenv("IVIT_GEMM_ISA", isa)
    rng = np.random.default_rng(ISAS[isa] + 40)
    nb, s, h = 2, 11, 3
    for adt, bdt, d in ((np.uint8, np.uint8, 16), (np.int8, np.uint8, 7), (np.uint8, np.int8, 32)):
        x = operand(rng, adt, (nb, s, 3 * h * d + 5))  # 5 channels more: offsets within a wider row
        def heads(t, off, d=d):
            return np.ascontiguousarray(t[:, :, off:off + h * d].reshape(nb, s, h, d).transpose(0, 2, 1, 3))

        view = {"heads": h, "dim": d, "seq": s, "channels": x.shape[2]}
        a = heads(x, 2)
        for trans in (False, True):
            xb = operand(rng, bdt, (nb, s, 3 * h * d + 5)) if bdt != adt else x
            b = heads(xb, 2 + h * d)  # [nb, h, s, d]: K (trans_b) or V
            za, zb = zero_point(rng, adt, False), zero_point(rng, bdt, True)
            want = accumulate(a, np.swapaxes(b, -1, -2), za, zb) if trans else None
            if not trans:
                a2 = operand(rng, adt, (nb, h, s, s))  # P · V: A is no view
                want = accumulate(a2, b, za, zb)
            model, _ = batch_model(a if trans else a2, b, za, zb, trans_b=trans)
            attrs = {f"b_{k}": v for k, v in view.items()} | {"b_offset": 2 + h * d}
            if trans:
                attrs |= {f"a_{k}": v for k, v in view.items()} | {"a_offset": 2}
            else:
                attrs |= {"y_heads": h, "y_seq": s}  # merged: [nb, s, h * n]
                want = np.ascontiguousarray(want.transpose(0, 2, 1, 3)).reshape(nb, s, -1)
            feeds = {"a": x if trans else a2, "b": xb}
            got = ort_run(with_views(model, **attrs), feeds, 2)
            np.testing.assert_array_equal(got, want, err_msg=f"{adt} {bdt} {d} {trans}")


def test_head_view_that_does_not_fit_is_refused():
    """A view whose rows and channels do not divide the source's elements names the node."""
    rng = np.random.default_rng(41)
    x, b = operand(rng, np.uint8, (2, 11, 20)), operand(rng, np.uint8, (2, 2, 11, 4))
    bad, _ = batch_model(x, b, None, None, trans_b=True)
    wrong = {"a_heads": 2, "a_dim": 4, "a_offset": 0, "a_seq": 12, "a_channels": 20}
    with pytest.raises(Exception, match="bmm.*elements are not"):
        ort_run(with_views(bad, **wrong), {"a": x, "b": b})


def test_bad_operands_name_the_node():
    """Shapes that do not multiply or broadcast, and zero points that are not single values, fail naming the
    node."""
    rng = np.random.default_rng(5)
    a, b = operand(rng, np.uint8, (2, 4, 8)), operand(rng, np.uint8, (2, 7, 3))
    with pytest.raises(Exception, match="QBatchMatMul node 'bmm': A's K = 8 differs from B's 7"):
        ort_run(*batch_model(a, b, None, None))
    with pytest.raises(
        Exception, match="QBatchMatMul node 'bmm': the batch axes of A and B do not broadcast"
    ):
        ort_run(*batch_model(a, operand(rng, np.uint8, (3, 8, 3)), None, None))
    with pytest.raises(Exception, match="QBatchMatMul node 'bmm': a_zero_point must be a single value"):
        ort_run(*batch_model(a, operand(rng, np.uint8, (2, 8, 3)), np.zeros(4, np.uint8), None))
