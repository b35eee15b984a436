"""The compile step's head views (:mod:`ivit_onnx.engines.onnxruntime.head_views`): attention's head split
(timm's packed qkv Reshape/Transpose/Split/Squeeze, its Gather and dynamo's Slice forms, onnxruntime
quantize_static's with 0 / -1 target entries resolved from the declared shapes, Hugging Face's per-tensor
Reshape/Transpose with Kᵀ as one Transpose) and head merge (Transpose + Reshape) read and written
in place by QBatchMatMul, on tiny graphs, bit-exact with the reference evaluator on the graph as converted,
on every instruction-set path; and the relayouts it must leave alone."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from ivit_onnx.engines.onnxruntime import compile_model
from ivit_onnx.engines.onnxruntime.qgemm_fold import ENGINE_DOMAIN, fast_path
from ivit_onnx.opset import OPS, native_kernels
from ivit_onnx.opset.reference import evaluator
from tests.engines.test_qgemm_fold import library_run

pytestmark = [
    pytest.mark.skipif(not native_kernels.available(), reason="the native library was not built"),
    pytest.mark.skipif(not fast_path(), reason="no vector QGemm path: the compile step keeps MatMulInteger"),
]
B, S, H, D = 2, 7, 3, 5  # batch, tokens, heads, head size


def _dynamic_shape(nodes: list, source: str, name: str) -> str:
    """``Concat(Shape(source)[0:1], <name>_tail)``: a Reshape target with a run-time batch (as exported)."""
    nodes += [
        helper.make_node("Shape", [source], [f"{name}_shape"]),
        helper.make_node("Slice", [f"{name}_shape", "i0", "i1"], [f"{name}_batch"]),
        helper.make_node("Concat", [f"{name}_batch", f"{name}_tail"], [name], axis=0),
    ]
    return name


def attention_model(rng, dt, form: str, *, merge_out=True) -> tuple[onnx.ModelProto, dict, dict]:
    """q, k, v split from activations (``form``: "packed", "gather" or "hf"), then ``MatMulInteger(q, kᵀ) ->
    y_s`` and ``MatMulInteger(p, v) -> Requantize -> Transpose -> Reshape -> ctx`` (heads merged)."""
    info = np.iinfo(dt)
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dt))
    inits = {
        "i0": np.array([0], np.int64), "i1": np.array([1], np.int64),
        "zq": dt(info.max), "zv": dt(rng.integers(info.min, info.max + 1)),
        "zx": np.int32(rng.integers(-100, 100)), "b": np.int64(rng.integers(1 << 20, 1 << 22)),
        "c": np.int64(rng.integers(24, 30)), "zy": np.uint8(rng.integers(0, 256)),
        "ctx_shape_tail": np.array([S, H * D], np.int64),
    }
    nodes: list = []
    shapes = {"p": [B, H, S, S]}
    if form in ("packed", "gather", "slice"):
        shapes["x"] = [B, S, 3 * H * D]
        if form == "slice":  # the dynamo exporter's form: a constant target, Slice + Squeeze
            inits["qkv"] = np.array([-1, S, 3, H, D], np.int64)
        else:
            inits["qkv_tail"] = np.array([S, 3, H, D], np.int64)
            _dynamic_shape(nodes, "x", "qkv")
        nodes.append(helper.make_node("Reshape", ["x", "qkv"], ["r"]))
        nodes.append(helper.make_node("Transpose", ["r"], ["t"], perm=[2, 0, 3, 1, 4]))
        if form == "slice":
            inits["ax0"] = np.array([0], np.int64)
            for j, name in enumerate("qkv"):
                inits[f"lo{j}"], inits[f"hi{j}"] = np.array([j], np.int64), np.array([j + 1], np.int64)
                nodes.append(helper.make_node("Slice", ["t", f"lo{j}", f"hi{j}", "ax0"], [f"s{j}"]))
                nodes.append(helper.make_node("Squeeze", [f"s{j}", "ax0"], [name]))
        elif form == "packed":
            inits["ones"] = np.array([1, 1, 1], np.int64)
            inits["ax0"] = np.array([0], np.int64)
            nodes.append(helper.make_node("Split", ["t", "ones"], ["s0", "s1", "s2"], axis=0))
            for j, name in enumerate("qkv"):
                nodes.append(helper.make_node("Squeeze", [f"s{j}", "ax0"], [name]))
        else:
            for j, name in enumerate("qkv"):
                inits[f"g{j}"] = np.array(j, np.int64)
                nodes.append(helper.make_node("Gather", ["t", f"g{j}"], [name], axis=0))
        nodes.append(helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]))
    elif form == "ort":  # onnxruntime's quantize_static export: 0 and -1 entries, Split before the Transpose
        shapes["x"] = [B, S, 3 * H * D]
        inits |= {"qkv": np.array([0, 0, 3, H, -1], np.int64), "ones": np.array([1, 1, 1], np.int64),
                  "ax0": np.array([0], np.int64), "ax2": np.array([2], np.int64)}
        nodes += [helper.make_node("Reshape", ["x", "qkv"], ["r"]),
                  helper.make_node("Split", ["r", "ones"], ["s0", "s1", "s2"], axis=2),
                  helper.make_node("Squeeze", ["s1", "ax2"], ["k3"]),
                  helper.make_node("Transpose", ["k3"], ["kt"], perm=[0, 2, 3, 1])]
        for j, name in ((0, "q"), (2, "v")):
            nodes += [helper.make_node("Transpose", [f"s{j}"], [f"t{j}"], perm=[2, 0, 3, 1, 4]),
                      helper.make_node("Squeeze", [f"t{j}", "ax0"], [name])]
    else:  # Hugging Face: one projection each, Kᵀ as one Transpose [0, 2, 3, 1]
        for name, perm in (("q", [0, 2, 1, 3]), ("k", [0, 2, 3, 1]), ("v", [0, 2, 1, 3])):
            shapes[f"x{name}"] = [B, S, H * D]
            inits[f"{name}r_tail"] = np.array([S, H, D], np.int64)
            target = _dynamic_shape(nodes, f"x{name}", f"{name}r")
            nodes.append(helper.make_node("Reshape", [f"x{name}", target], [f"{name}_r"]))
            to = "kt" if name == "k" else name
            nodes.append(helper.make_node("Transpose", [f"{name}_r"], [to], perm=perm))
    nodes += [
        helper.make_node("MatMulInteger", ["q", "kt", "zq", ""], ["y_s"], name="qk"),
        helper.make_node("MatMulInteger", ["p", "v", "", "zv"], ["acc"], name="pv"),
        OPS["Requantize"].make_node(["acc", "zx", "b", "c", "zy"], ["ctx4"], name="req", qmin=0, qmax=255),
    ]
    out = "ctx4"
    if merge_out:
        nodes.append(helper.make_node("Transpose", ["ctx4"], ["ctx_t"], perm=[0, 2, 1, 3]))
        if form == "ort":
            inits["ctx_shape"] = np.array([0, 0, -1], np.int64)
            target = "ctx_shape"
        else:
            target = _dynamic_shape(nodes, "xq" if form == "hf" else "x", "ctx_shape")  # B = x.shape[0]
        nodes.append(helper.make_node("Reshape", ["ctx_t", target], ["ctx"]))
        out = "ctx"
    graph = helper.make_graph(
        nodes,
        "heads",
        [helper.make_tensor_value_info(n, TensorProto.UINT8 if n == "p" else elem, ["batch", *d[1:]])
         for n, d in shapes.items()],
        [helper.make_tensor_value_info("y_s", TensorProto.INT32, None),
         helper.make_tensor_value_info(out, TensorProto.UINT8, None)],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.ivit", 1)], ir_version=10
    )
    feeds = {}
    for n, s in shapes.items():
        t = np.uint8 if n == "p" else dt
        ti = np.iinfo(t)
        x = rng.integers(ti.min, ti.max + 1, s).astype(t)
        x[rng.random(x.shape) < 0.2] = ti.min
        x[rng.random(x.shape) < 0.2] = ti.max
        feeds[n] = x
    return model, feeds, shapes


def _check(model, feeds, compiled) -> None:
    want = evaluator(model).run(None, feeds)
    got = library_run(compiled.model, feeds)
    assert all(np.array_equal(g, w) for g, w in zip(got, want, strict=True))


@pytest.mark.parametrize("isa", ["portable", "avx2", "vnni", "amx", "neon", "dotprod", "i8mm", ""])
def test_head_views_are_bit_exact(isa, monkeypatch):
    from tests.opset.test_qgemm import ISAS, need

    if isa:
        need(isa)
        monkeypatch.setenv("IVIT_GEMM_ISA", isa)
    rng = np.random.default_rng(ISAS.get(isa, 0) + 17)
    for dt in (np.int8, np.uint8):
        for form in ("packed", "gather", "hf"):
            model, feeds, _ = attention_model(rng, dt, form)
            # int8 graph inputs: u8_gemm would give V a uint8 copy (a Requantize, not a relayout)
            compiled = compile_model(model, u8_gemm=dt == np.uint8)
            ops = [n.op_type for n in compiled.model.graph.node]
            # every relayout went: both GEMMs read the activations in place, the merge is written in place
            assert not {"Transpose", "Split", "Squeeze", "Gather", "Reshape"} & set(ops), (form, ops)
            assert compiled.counts["head_views"] == 4, form  # q, k, v (p is no view) and the merge
            views = [n for n in compiled.model.graph.node if n.domain == ENGINE_DOMAIN]
            assert all(any(a.name.endswith("_heads") for a in n.attribute) for n in views)
            assert "4 attention head splits and merges read in place" in compiled.describe()
            _check(model, feeds, compiled)
            # and at another batch (the views' batch comes from the element count at run time)
            more = {n: np.concatenate([x, x[:1]]) for n, x in feeds.items()}
            _check(model, more, compiled)


def test_left_alone():
    """A head split whose target's sequence entry is computed at run time is not a view, and an output the
    graph reads elsewhere is not merged."""
    rng = np.random.default_rng(5)
    model, feeds, _ = attention_model(rng, np.uint8, "hf")
    tail = next(t for t in model.graph.initializer if t.name == "qr_tail")
    tail.CopyFrom(numpy_helper.from_array(np.array([-1, H, D], np.int64), "qr_tail"))  # q: seq from the count
    compiled = compile_model(model)
    assert compiled.counts["head_views"] == 3  # k, v and the merge
    assert [n.op_type for n in compiled.model.graph.node].count("Transpose") == 1  # q's
    _check(model, feeds, compiled)
    model, feeds, _ = attention_model(rng, np.uint8, "packed")
    model.graph.output.append(helper.make_tensor_value_info("ctx_t", TensorProto.UINT8, None))
    compiled = compile_model(model)
    assert compiled.counts["head_views"] == 3
    _check(model, feeds, compiled)


def test_reshape_entries_resolved_only_where_determined():
    """A 0 copies a declared dimension, a -1 takes the rest of the declared row only where the batch entry
    copies the batch; otherwise (undeclared, a run-time batch entry, allowzero) the split is not a view."""
    from ivit_onnx.engines.onnxruntime.head_views import _resolve

    assert _resolve([0, 0, 3, 3, -1], [None, 197, 576], False) == [0, 197, 3, 3, 64]
    assert _resolve([None, 197, 3, 3, 64], None, False) == [None, 197, 3, 3, 64]
    assert _resolve([None, 0, 3, 3, -1], [None, 197, 576], False) is None
    assert _resolve([0, 0, 3, 3, -1], None, False) is None
    assert _resolve([0, 0, 3, 3, -1], [None, 197, 576], True) is None
    assert _resolve([0, 0, 5, -1], [None, 197, 576], False) is None  # 576 is no multiple of 5
