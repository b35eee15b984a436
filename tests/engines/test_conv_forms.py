"""Every ConvInteger runs as uint8 x constant uint8 (and a uint8 x int8 GEMM with -128 weights as uint8 x
uint8), exactly: compiled (``engines/onnxruntime/u8_gemm.py``), in the function bodies (``int8_gemms.py``) and
in the interpreter, bit for bit against numpy int64 sums at the int8 extremes that wrap on a Cortex-A72.
``IVIT_GEMM_PROBE_FAULT=wrap`` makes the int8 x int8 forms count as wrong on any CPU, as they are there
(tests/arm/exactness.py runs the same model under QEMU)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from ivit_onnx import int8_gemms
from ivit_onnx.engines.onnxruntime import compile_model
from ivit_onnx.opset import gemm_probe, native_kernels, ort_library
from ivit_onnx.runners import make_runner

needs_library = pytest.mark.skipif(not native_kernels.available(), reason="the native library was not built")

#: ConvInteger cases: output -> (input, weights, groups, stride, pad, x zero point, w zero point)
CONVS = {"conv": ("q", "w3", 1, 2, 1, None, None), "dw": ("q", "wdw", 8, 1, 1, None, None),
         "fed": ("xi", "w3", 1, 1, 1, 3, -2), "u8": ("qu", "w3", 1, 2, 0, 128, None)}


def conv_ref(x: np.ndarray, w: np.ndarray, xz: int, wz: int, stride: int, pad: int, group: int) -> np.ndarray:
    """ConvInteger's int32 sums in int64: ``(x - xz)(w - wz)``, padding contributing 0."""
    x = np.pad(x.astype(np.int64) - xz, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    w = w.astype(np.int64) - wz
    (n, _, h, wd), (o, cg, kh, kw) = x.shape, w.shape
    ho, wo = (h - kh) // stride + 1, (wd - kw) // stride + 1
    y = np.zeros((n, o, ho, wo), np.int64)
    for oc in range(o):
        g = oc // (o // group)
        for i in range(ho):
            for j in range(wo):
                win = x[:, g * cg:(g + 1) * cg, i * stride:i * stride + kh, j * stride:j * stride + kw]
                y[:, oc, i, j] = (win * w[oc]).sum(axis=(1, 2, 3))
    return y


def conv_model(seed: int = 0) -> tuple[onnx.ModelProto, dict, dict]:
    """int8 (QuantizeLinear, a graph input) and uint8 activations into 3x3 ConvIntegers (strided, padded,
    depthwise, zero points) with weights at -128, and a uint8 x int8 MatMulInteger with weights at -128; the
    feeds at the extremes, and the numpy int64 references."""
    rng = np.random.default_rng(seed)
    ext = lambda shape, values, dtype: rng.choice(np.array(values), shape).astype(dtype)  # noqa: E731
    consts = {"w3": ext((8, 8, 3, 3), [-128, -128, 127, -127, 0, 5], np.int8),
              "wdw": ext((8, 1, 3, 3), [-128, -128, 127, 1], np.int8),
              "wm": ext((64, 16), [-128, 127, -128, 3], np.int8),
              "s": np.array(1.0, np.float32), "z8": np.array(0, np.int8), "zu": np.array(128, np.uint8),
              "xz_fed": np.array(3, np.int8), "wz_fed": np.array(-2, np.int8),
              "xz_u8": np.array(128, np.uint8), "mz": np.array(5, np.uint8)}
    nodes = [helper.make_node("QuantizeLinear", ["xf", "s", "z8"], ["q"], name="q"),
             helper.make_node("QuantizeLinear", ["xf", "s", "zu"], ["qu"], name="qu"),
             helper.make_node("MatMulInteger", ["xu", "wm", "mz"], ["mm"], name="mm")]
    for out, (x, w, group, stride, pad, xz, wz) in CONVS.items():
        zps = ([f"xz_{out}"] if xz is not None else []) + ([f"wz_{out}"] if wz is not None else [])
        nodes.append(helper.make_node("ConvInteger", [x, w, *zps], [out], name=out, group=group,
                                      strides=[stride] * 2, pads=[pad] * 4, kernel_shape=[3, 3]))
    ins = [helper.make_tensor_value_info("xf", TensorProto.FLOAT, [2, 8, 7, 7]),
           helper.make_tensor_value_info("xi", TensorProto.INT8, [2, 8, 7, 7]),
           helper.make_tensor_value_info("xu", TensorProto.UINT8, [3, 64])]
    outs = [helper.make_tensor_value_info(o, TensorProto.INT32, None) for o in [*CONVS, "mm"]]
    inits = [numpy_helper.from_array(v, k) for k, v in consts.items()]
    g = helper.make_graph(nodes, "convs", ins, outs, inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    feeds = {"xf": ext((2, 8, 7, 7), [-300, -128, -1, 0, 127, 300], np.float32),
             "xi": ext((2, 8, 7, 7), [-128, -128, 127, 3, 0], np.int8),
             "xu": ext((3, 64), [0, 255, 5], np.uint8)}
    acts = {"q": np.clip(feeds["xf"], -128, 127).astype(np.int8), "xi": feeds["xi"],
            "qu": np.clip(feeds["xf"] + 128, 0, 255).astype(np.uint8)}
    want = {out: conv_ref(acts[x], consts[w], xz or 0, wz or 0, stride, pad, group)
            for out, (x, w, group, stride, pad, xz, wz) in CONVS.items()}
    want["mm"] = (feeds["xu"].astype(np.int64) - 5) @ consts["wm"].astype(np.int64)
    return m, feeds, want


def _same(got: dict | list, want: dict) -> None:
    got = got if isinstance(got, dict) else dict(zip(want, got, strict=True))
    for k, v in want.items():
        assert got[k].dtype == np.int32 and np.array_equal(got[k], v), k


def _init_types(model: onnx.ModelProto) -> dict[str, int]:
    return {t.name: t.data_type for t in model.graph.initializer}


def _gemm_types(model: onnx.ModelProto) -> dict[str, tuple[int, int]]:
    """Each GEMM's (A zero point, B) element types: uint8 zero points mean uint8 operands (ONNX ties them)."""
    types = _init_types(model)
    return {n.name: (types.get(n.input[2]) if len(n.input) > 2 else None, types.get(n.input[1]))
            for n in model.graph.node if n.op_type in ("ConvInteger", "MatMulInteger")}


def test_compile_makes_every_conv_uint8_by_uint8():
    model, _, _ = conv_model()
    compiled = compile_model(model)
    u8 = TensorProto.UINT8
    assert _gemm_types(compiled.model) == {k: (u8, u8) for k in [*CONVS, "mm"]}
    assert compiled.counts["u8_conv"] == len(CONVS)
    assert f"{len(CONVS)} ConvInteger as uint8 x uint8" in compiled.describe()
    # the graph input (no producer to re-encode) reaches its ConvInteger through a uint8 copy
    fed = next(n for n in compiled.model.graph.node if n.name == "fed")
    assert any(n.op_type == "Requantize" and n.output[0] == fed.input[0] for n in compiled.model.graph.node)


@needs_library
@pytest.mark.parametrize("fault", ["", "wrap"])
def test_library_is_exact(fault, monkeypatch):
    model, feeds, want = conv_model()
    if fault:
        monkeypatch.setenv("IVIT_GEMM_PROBE_FAULT", fault)
    runner = make_runner("library", model, 1)
    _same(runner.run(feeds), want)
    forms = runner.engine.gemm_check.split("; forms: ")[1]
    assert "conv_u8u8 exact" in forms and "conv_u8u8_dw exact" in forms
    assert ("conv_s8s8 inexact" in forms) == (fault == "wrap")


@needs_library
def test_session_asked_for_int8_convs_falls_back_where_they_wrap(monkeypatch, capsys):
    from ivit_onnx import InferenceSession

    model, feeds, want = conv_model(1)
    monkeypatch.setenv("IVIT_GEMM_PROBE_FAULT", "wrap")
    capsys.readouterr()
    sess = InferenceSession(model, threads=1, u8_gemm=False)
    assert "int8 x int8 GEMMs are not exact" in capsys.readouterr().err
    assert sess.compiled.counts["u8_conv"] == len(CONVS)
    _same(sess.run(None, feeds), want)


def test_function_bodies_rewrite_convs_and_min_weights(monkeypatch):
    model, feeds, want = conv_model(2)
    u8, s8 = TensorProto.UINT8, TensorProto.INT8
    rewritten, changed = int8_gemms.as_uint8(model, matmuls=False)
    assert changed == len(CONVS) and _gemm_types(rewritten)["mm"] == (u8, s8)  # the u8 x s8 GEMM as is
    rewritten, changed = int8_gemms.as_uint8(model)
    assert changed == len(CONVS) + 1
    mm = next(n for n in rewritten.graph.node if n.name == "mm")
    assert mm.input[1] != "wm" and mm.input[3]  # B moved to uint8 (w + 128), its zero point 128
    import onnxruntime as ort

    sess = ort.InferenceSession(rewritten.SerializeToString(), providers=["CPUExecutionProvider"])
    _same(sess.run(list(want), feeds), want)
    for fault in ("", "wrap"):
        int8_gemms.probe.cache_clear()
        monkeypatch.setenv("IVIT_GEMM_PROBE_FAULT", fault)
        try:
            assert not fault or int8_gemms.wraps()
            assert int8_gemms.uint8_convs()
            assert int8_gemms.exact_int8_gemms(model) is not model  # the ConvIntegers, on every CPU
            _same(ort_library.session(model, "functions").run(list(want), feeds), want)
        finally:
            int8_gemms.probe.cache_clear()


def test_interpreter_is_exact():
    model, feeds, want = conv_model(3)
    _same(make_runner("interpreter", model).run(feeds), want)


def test_probe_conv_forms_exact_here():
    """The ConvInteger forms the artifact runs are exact on this CPU, with or without the x86 precision
    option (onnxruntime's s8 -> u8 weight conversion does not touch ConvInteger)."""
    for precision in (False, True):
        assert not set(int8_gemms.CONV_FORMS) & set(gemm_probe.inexact(precision))
