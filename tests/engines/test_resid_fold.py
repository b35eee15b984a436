"""The compile step's residual fusion (:mod:`ivit_onnx.engines.onnxruntime.resid_fold`): ``QGemm |
QGemmTable -> IAdd`` as QGemmAdd / QGemmTableAdd, on tiny graphs (an activation residual on either side of
the IAdd, a constant one as ``quantize_static``'s bias, through a table; a GELU chain after the sum) compiled
by ``compile_model`` and run by the library, equal to the reference evaluator on the graph as converted, on
every instruction-set path; the tiny ViT's residual adds; and the IAdds it must leave alone."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from ivit_onnx.engines.onnxruntime import compile_model
from ivit_onnx.engines.onnxruntime.qgemm_fold import fast_path, fold_qgemm
from ivit_onnx.engines.onnxruntime.resid_fold import fold_residuals
from ivit_onnx.opset import OPS, native_kernels
from ivit_onnx.opset.reference import evaluator
from tests.engines.test_qgemm_fold import N, fused_ops, gemm_model, library_run

pytestmark = [
    pytest.mark.skipif(not native_kernels.available(), reason="the native library was not built"),
    pytest.mark.skipif(not fast_path(), reason="no vector QGemm path: the compile step keeps the GEMMs"),
]


def resid_model(rng, adt, *, side=1, form="act", r_type=np.int8, r_shape=(2, 5, N), table=False, out_v=False,
                shift=53):
    """``gemm_model``'s ``a -> GEMM -> Requantize [-> Requantize]`` (v), then ``IAdd(v, r)`` (v on
    ``side``) with the converter's dyadic parameters: ``r`` an input of ``r_shape`` ("act") or N constants
    ("column")."""
    model, feeds = gemm_model(rng, adt, table=table)
    g = model.graph
    v = g.output[0].name
    v_type = np.int16 if table else np.int8
    info = np.iinfo(r_type)
    r = rng.integers(max(info.min, -3000), min(info.max, 3000) + 1, r_shape if form == "act" else (N,))
    r = r.astype(r_type)
    scale = 1 << shift
    params = {
        "zv": v_type(rng.integers(-4, 5)), "zr": r_type(rng.integers(0, 9)),
        "mv": np.int64(int(rng.uniform(0.6, 1.4) * scale)),
        "mr": np.int64(int(rng.uniform(0.01, 0.2) * scale)),
        "cs": np.int64(shift), "zs": np.int8(rng.integers(-5, 6)),
    }
    g.initializer.extend(numpy_helper.from_array(np.asarray(x), k) for k, x in params.items())
    if form == "act":
        g.input.append(helper.make_tensor_value_info("r", helper.np_dtype_to_tensor_dtype(r.dtype), r.shape))
        feeds["r"] = r
    else:
        g.initializer.append(numpy_helper.from_array(r, "r"))
    g.value_info.append(helper.make_tensor_value_info(v, helper.np_dtype_to_tensor_dtype(np.dtype(v_type)),
                                                      [2, 5, N]))
    a, b = (v, "r") if side == 0 else ("r", v)
    za, zb, ma, mb = ("zv", "zr", "mv", "mr") if side == 0 else ("zr", "zv", "mr", "mv")
    g.node.append(OPS["IAdd"].make_node([a, b, za, zb, ma, mb, "cs", "zs"], ["sum"], name="iadd",
                                        qmin=-128, qmax=127))
    outs = [helper.make_tensor_value_info("sum", TensorProto.INT8, None)]
    if out_v:
        outs.append(g.output[0])
    del g.output[:]
    g.output.extend(outs)
    return model, feeds


@pytest.mark.parametrize("isa", ["portable", "avx2", "vnni", "amx", "neon", "dotprod", "i8mm", ""])
def test_fused_artifact_is_bit_exact(isa, monkeypatch):
    from tests.opset.test_qgemm import ISAS, need

    if isa:
        need(isa)
        monkeypatch.setenv("IVIT_GEMM_ISA", isa)
    rng = np.random.default_rng([ISAS.get(isa, 0), 30])
    cases = [dict(side=1), dict(side=0, r_type=np.uint8), dict(side=1, r_type=np.int16, r_shape=(1, 5, N)),
             dict(side=0, r_type=np.int32, r_shape=(N,)), dict(form="column", side=1),
             dict(form="column", side=0, table=True), dict(side=1, table=True, shift=20)]
    saturated = 0
    for adt in (np.int8, np.uint8):
        for kw in cases:
            model, feeds = resid_model(rng, adt, **kw)
            compiled = compile_model(model)
            assert compiled.counts["resid_fold"] == 1, kw
            assert fused_ops(compiled.model) == ["QGemmTableAdd" if kw.get("table") else "QGemmAdd"]
            assert not [n for n in compiled.model.graph.node if n.op_type == "IAdd"]
            want = evaluator(model).run(None, feeds)
            got = library_run(compiled.model, feeds)
            assert all(np.array_equal(g, w) for g, w in zip(got, want, strict=True)), (adt, kw)
            saturated += int((want[0] == 127).any() or (want[0] == -128).any())
    assert saturated >= len(cases), saturated  # sums past the clip in half the cases at least


def gelu_after_the_sum(model: onnx.ModelProto, head: str, per_channel: bool = False,
                       source: str = "sum") -> onnx.ModelProto:
    """``resid_model``'s sum, then a GELU as the converter writes one after a ``quantize_static`` bias IAdd:
    ``Requantize`` (head "wide": the upscale to int32, which chain_fold tabulates over the int8 sum; "narrow":
    to int8, a table over its outputs, per channel if asked) and ShiftGELU, the graph's output."""
    from tests.opset.oneop import shiftgelu_params

    g = model.graph
    if head == "wide":
        up = 22
        params = {"hz": np.int8(0), "hb": np.int64(up), "hc": np.int64(0), "hy": np.int32(0)}
        bounds, reach = dict(qmin=-(1 << 31), qmax=(1 << 31) - 1), up * 128
    else:
        b = np.array([3 << 19] * (N if per_channel else 1), np.int64)
        b[-1] += 12345
        params = {"hz": np.int8(2), "hb": b, "hc": np.full(b.shape, 20, np.int64), "hy": np.int8(-1)}
        bounds, reach = dict(qmin=-128, qmax=127), 128
    attrs, gb, gc = shiftgelu_params(1.0 / 300, 0.02, reach, 15, -128, 127)
    params |= {"gb": np.int64(gb), "gc": np.int64(gc), "gz": np.int8(-3)}
    g.initializer.extend(numpy_helper.from_array(np.asarray(x), k) for k, x in params.items())
    g.node.append(OPS["Requantize"].make_node([source, "hz", "hb", "hc", "hy"], ["h"], name="head", **bounds))
    g.node.append(OPS["ShiftGELU"].make_node(["h", "gb", "gc", "gz"], ["gelu_out"], name="gelu", **attrs))
    g.output[0].CopyFrom(helper.make_tensor_value_info("gelu_out", TensorProto.INT8, None))
    return model


@pytest.mark.parametrize("isa", ["portable", "avx2", "vnni", "amx", "neon", "dotprod", "i8mm"])
def test_a_table_after_the_sum(isa, monkeypatch):
    """A GELU after the sum (chain_fold's RequantizeTable, over the int8 sum or over its Requantize's outputs)
    goes into the same epilogue as QGemmAddTable / QGemmTableAddTable, with the reference evaluator's bits on
    every path; a per-channel Requantize there stays a RequantizeTable of its own."""
    from tests.opset.test_qgemm import ISAS, need

    need(isa)
    monkeypatch.setenv("IVIT_GEMM_ISA", isa)
    rng = np.random.default_rng([ISAS[isa], 31])
    for head, kw in (("wide", dict(form="column")), ("narrow", dict(side=0)), ("wide", dict(table=True)),
                     ("narrow", dict(form="column", side=0, table=True))):
        model, feeds = resid_model(rng, np.uint8, **kw)
        model = gelu_after_the_sum(model, head)
        compiled = compile_model(model)
        assert fused_ops(compiled.model) == ["QGemmTableAddTable" if kw.get("table") else "QGemmAddTable"]
        assert compiled.counts["post_table"] == 1 and "1 tabulated chains after" in compiled.describe()
        want = evaluator(model).run(None, feeds)[0]
        got = library_run(compiled.model, feeds)[0]
        assert got.dtype == want.dtype and np.array_equal(got, want), (head, kw)
        assert len(np.unique(want)) > 10  # the table's values, not one clipped end
    model, feeds = resid_model(rng, np.uint8)
    model = gelu_after_the_sum(model, "narrow", per_channel=True)
    compiled = compile_model(model)
    assert fused_ops(compiled.model) == ["QGemmAdd"] and compiled.counts["post_table"] == 0
    assert np.array_equal(library_run(compiled.model, feeds)[0], evaluator(model).run(None, feeds)[0])


def then_residual(model: onnx.ModelProto, rng, form: str = "act", side: int = 0) -> onnx.ModelProto:
    """``resid_model``'s sum, then a second IAdd with ``r2`` (an activation input, or N constants), the
    graph's output: ``quantize_static``'s bias IAdd followed by the residual IAdd."""
    g = model.graph
    shape = [2, 5, N] if form == "act" else [N]
    r2 = rng.integers(-128, 128, shape).astype(np.int8)
    if form == "act":
        g.input.append(helper.make_tensor_value_info("r2", TensorProto.INT8, shape))
    else:
        g.initializer.append(numpy_helper.from_array(r2, "r2"))
    g.value_info.append(helper.make_tensor_value_info("sum", TensorProto.INT8, [2, 5, N]))
    params = {"z1": np.int8(3), "z2": np.int8(-2), "m1": np.int64(int(0.9 * (1 << 40))),
              "m2": np.int64(int(0.7 * (1 << 40))), "c3": np.int64(40), "z3": np.int8(1)}
    g.initializer.extend(numpy_helper.from_array(np.asarray(x), k) for k, x in params.items())
    a, b = ("sum", "r2") if side == 0 else ("r2", "sum")
    za, zb, ma, mb = ("z1", "z2", "m1", "m2") if side == 0 else ("z2", "z1", "m2", "m1")
    g.node.append(OPS["IAdd"].make_node([a, b, za, zb, ma, mb, "c3", "z3"], ["sum2"], name="iadd2",
                                        qmin=-128, qmax=127))
    g.output[0].CopyFrom(helper.make_tensor_value_info("sum2", TensorProto.INT8, None))
    return model, r2 if form == "act" else None


@pytest.mark.parametrize("isa", ["portable", "avx2", "vnni", "amx", "neon", "dotprod", "i8mm"])
def test_a_second_iadd(isa, monkeypatch):
    """``quantize_static``'s bias IAdd then the residual IAdd: both in the epilogue as QGemmAddAdd (or
    QGemmTableAddAdd; with a GELU after, ...Table), either side, with the reference evaluator's bits on every
    path; two activation residuals keep the second IAdd."""
    from tests.opset.test_qgemm import ISAS, need

    need(isa)
    monkeypatch.setenv("IVIT_GEMM_ISA", isa)
    rng = np.random.default_rng([ISAS[isa], 32])
    for kw, side, gelu in ((dict(form="column"), 0, False), (dict(form="column", table=True), 1, False),
                           (dict(form="column"), 1, True)):
        model, feeds = resid_model(rng, np.uint8, **kw)
        model, r2 = then_residual(model, rng, side=side)
        feeds["r2"] = r2
        if gelu:
            model = gelu_after_the_sum(model, "wide", source="sum2")
        compiled = compile_model(model)
        base = "QGemmTableAddAdd" if kw.get("table") else "QGemmAddAdd"
        assert fused_ops(compiled.model) == [base + ("Table" if gelu else "")], (kw, side, gelu)
        assert "1 second IAdds (after a bias IAdd) in the same epilogue" in compiled.describe()
        want = evaluator(model).run(None, feeds)[0]
        got = library_run(compiled.model, feeds)[0]
        assert got.dtype == want.dtype and np.array_equal(got, want), (kw, side, gelu)
    model, feeds = resid_model(rng, np.uint8)  # an activation in the first IAdd too: the second stays
    model, r2 = then_residual(model, rng)
    feeds["r2"] = r2
    compiled = compile_model(model)
    assert fused_ops(compiled.model) == ["QGemmAdd"]
    assert np.array_equal(library_run(compiled.model, feeds)[0], evaluator(model).run(None, feeds)[0])


def test_sum_of_two_gemms():
    """An IAdd of two QGemm outputs takes the first into its epilogue, the second's output as its residual."""
    rng = np.random.default_rng(11)
    model, feeds = resid_model(rng, np.uint8)
    g = model.graph
    second = [n for n in g.node if n.op_type != "IAdd"]
    renamed = {t: f"{t}_2" for n in second for t in n.output}
    for n in second:
        copy = onnx.NodeProto()
        copy.CopyFrom(n)
        copy.name = f"{n.name}_2"
        for i, t in enumerate(copy.input):
            copy.input[i] = renamed.get(t, t)
        for i, t in enumerate(copy.output):
            copy.output[i] = renamed[t]
        g.node.insert(len(g.node) - 1, copy)
    iadd = g.node[-1]
    iadd.input[0] = renamed[iadd.input[1]]  # IAdd(v_2, v): both addends GEMMs
    g.value_info.append(helper.make_tensor_value_info(iadd.input[0], TensorProto.INT8, [2, 5, N]))
    g.input.remove(next(i for i in g.input if i.name == "r"))
    del feeds["r"]
    compiled = compile_model(model)
    assert compiled.counts["resid_fold"] == 1
    assert sorted(fused_ops(compiled.model)) == ["QGemm", "QGemmAdd"]
    want = evaluator(model).run(None, feeds)
    got = library_run(compiled.model, feeds)
    np.testing.assert_array_equal(got[0], want[0])


def test_left_alone():
    """The GEMM output also a graph output or kept; a residual that would broadcast v up, or of unknown shape;
    a shift past 62; a non-scalar multiplier."""
    rng = np.random.default_rng(7)

    def fused(model, keep=frozenset()):
        return fold_residuals(fold_qgemm(model)[0], keep=keep)[1]

    model, _ = resid_model(rng, np.uint8)
    assert fused(model) == 1
    model, _ = resid_model(rng, np.uint8, out_v=True)
    assert fused(model) == 0
    model, _ = resid_model(rng, np.uint8)
    assert fused(model, keep={"q"}) == 0
    model, _ = resid_model(rng, np.uint8, r_shape=(3, 2, 5, N))
    assert fused(model) == 0
    model, _ = resid_model(rng, np.uint8)
    model.graph.input[1].type.tensor_type.ClearField("shape")
    assert fused(model) == 0
    model, _ = resid_model(rng, np.uint8, form="column")
    cs = next(t for t in model.graph.initializer if t.name == "cs")
    cs.CopyFrom(numpy_helper.from_array(np.int64(63), "cs"))
    assert fused(model) == 0
    model, _ = resid_model(rng, np.uint8)
    mv = next(t for t in model.graph.initializer if t.name == "mv")
    mv.CopyFrom(numpy_helper.from_array(np.array([3, 4], np.int64), "mv"))
    assert fused(model) == 0


def test_tiny_vit_residual_adds(tiny):
    """The tiny ViT's attention-projection and fc2 residual adds go into their QGemm, with the bits of the
    function bodies on int.onnx."""
    from ivit_onnx.runners import OrtRunner
    from tests.validate.conftest import x_batch

    model = onnx.load(tiny.int)
    residuals = [n for n in model.graph.node if n.op_type == "IAdd"]
    compiled = compile_model(model)
    assert compiled.counts["resid_fold"] == 4 == len(residuals) - 1  # the position embedding's stays
    assert "4 IAdds in the QGemm epilogue" in compiled.describe()
    x = x_batch(2)
    want = OrtRunner(model, "functions", 1).run({"input": x})
    got = library_run(compiled.model, {"input": x})
    assert len(got) == len(want)
    for g, w in zip(got, want.values(), strict=True):
        np.testing.assert_array_equal(g, w)


def test_quantize_static_bias_iadds(tmp_path):
    """onnxruntime ``quantize_static``'s tiny ViT: the bias IAdd(constant) after each weight GEMM's Requantize
    goes into its QGemm, with the bits of the function bodies on int.onnx."""
    torch = pytest.importorskip("torch")
    from ivit_onnx import rewrite
    from ivit_onnx.models.export import export_onnx
    from ivit_onnx.models.ort_qdq import ort_quantize
    from ivit_onnx.models.vit import vit
    from ivit_onnx.runners import OrtRunner

    torch.manual_seed(0)
    m = vit(img_size=32, patch_size=8, in_chans=3, num_classes=10, embed_dim=32, depth=2, num_heads=2,
            mlp_ratio=4).eval()
    calib = [torch.randn(4, 3, 32, 32) for _ in range(2)]
    export_onnx(m, calib[0], tmp_path / "fp32.onnx", exporter="torchscript")
    ort_quantize(tmp_path / "fp32.onnx", tmp_path / "fq.onnx", [c.numpy() for c in calib], "int8_sym")
    rewrite(tmp_path / "fq.onnx", tmp_path / "int.onnx")
    model = onnx.load(tmp_path / "int.onnx")
    compiled = compile_model(model)
    inits = {t.name for t in model.graph.initializer}
    constant_adds = [n for n in model.graph.node if n.op_type == "IAdd" and set(n.input[:2]) & inits]
    assert compiled.counts["patch_layout"] == 1  # the patch embedding's GEMM fuses too (no IAdd after it)
    assert compiled.counts["resid_fold"] == compiled.counts["qgemm"] - 2 > 0  # all but the head and the patch
    assert compiled.counts["post_table"] == 2  # fc1's GELU, its chain tabulated over the bias IAdd's sum
    assert compiled.counts["second_add"] == 4  # proj's and fc2's residual IAdd after their bias IAdd
    assert len(constant_adds) >= compiled.counts["resid_fold"]
    x = np.random.default_rng(0).standard_normal((2, 3, 32, 32)).astype(np.float32)
    name = model.graph.input[0].name
    want = OrtRunner(model, "functions", 1).run({name: x})
    got = library_run(compiled.model, {name: x})
    for g, w in zip(got, want.values(), strict=True):
        np.testing.assert_array_equal(g, w)
