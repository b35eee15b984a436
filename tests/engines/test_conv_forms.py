"""Every ConvInteger runs as uint8 x constant uint8 (and a uint8 x int8 GEMM with -128 weights as uint8 x
uint8), exactly: compiled (``engines/onnxruntime/u8_gemm.py``), in the function bodies (``int8_gemms.py``) and
in the interpreter, bit for bit against numpy int64 sums at the int8 extremes that wrap on a Cortex-A72.
``IVIT_GEMM_PROBE_FAULT=wrap`` makes the int8 x int8 forms count as wrong on any CPU, as they are there
(tests/arm/exactness.py runs the same model under QEMU)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto

from ivit_onnx import int8_gemms
from ivit_onnx.engines.onnxruntime import compile_model
from ivit_onnx.opset import gemm_probe, native_kernels, ort_library
from ivit_onnx.runners import make_runner
from tests.qemu import QEMU_X86, haswell

needs_library = pytest.mark.skipif(not native_kernels.available(), reason="the native library was not built")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "arm"))
try:  # one model for both: the ARM checks run without pytest
    from exactness import CONVS, conv_model
finally:
    sys.path.pop(0)

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


@needs_library
@pytest.mark.skipif(QEMU_X86 is None, reason="needs qemu-x86_64 (apt-get install qemu-user), an x86-64 host")
def test_exact_on_an_emulated_cpu_without_vnni():
    """The same checks as on ARM (tests/arm/exactness.py) on an emulated Haswell (AVX2, no VNNI), where
    onnxruntime's uint8 x int8 kernel saturates and its int8 x uint8 ConvInteger is wrong."""
    root = Path(__file__).resolve().parents[2]
    code = ("import sys; sys.argv = ['x']; sys.path.insert(0, 'tests/arm'); import exactness; "
            "exactness.convs()")
    done = haswell(code, timeout=300, cwd=str(root))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert len(lines) == 3 and all(line.startswith("PASS ") for line in lines), done.stdout


def _fed_matmuls() -> tuple[onnx.ModelProto, dict, dict]:
    """int8 graph inputs straight into MatMulIntegers (no producer to re-encode): by constant weights holding
    -128, and by another int8 input, at the extremes that wrap in int16 pairs."""
    from onnx import helper, numpy_helper

    k, n = 64, 16
    rng = np.random.default_rng(5)
    w = rng.integers(-128, 128, (k, n), dtype=np.int8)
    w[::2] = -128
    ins = [helper.make_tensor_value_info("x", TensorProto.INT8, [3, k]),
           helper.make_tensor_value_info("y", TensorProto.INT8, [k, n])]
    outs = [helper.make_tensor_value_info(o, TensorProto.INT32, [3, n]) for o in ("xw", "xy")]
    nodes = [helper.make_node("MatMulInteger", ["x", "w"], ["xw"], name="xw"),
             helper.make_node("MatMulInteger", ["x", "y"], ["xy"], name="xy")]
    g = helper.make_graph(nodes, "fed", ins, outs, [numpy_helper.from_array(w, "w")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    x = rng.integers(-128, 128, (3, k), dtype=np.int8)
    x[:, ::2] = -128
    y = np.full((k, n), -128, np.int8)
    feeds = {"x": x, "y": y}
    want = {"xw": (x.astype(np.int64) @ w.astype(np.int64)).astype(np.int32),
            "xy": (x.astype(np.int64) @ y.astype(np.int64)).astype(np.int32)}
    return model, feeds, want


@needs_library
def test_compile_feeds_int8_matmuls_it_cannot_reencode_through_uint8_copies(monkeypatch):
    """A MatMulInteger whose int8 operand has no producer to re-encode gets a uint8 copy of it, so that the
    artifact runs only the uint8 forms the self-check judges; exact where int8 x int8 wraps."""
    model, feeds, want = _fed_matmuls()
    compiled = compile_model(model, qgemm=False)
    u8 = TensorProto.UINT8
    zero_points = {n.name: tuple(_init_types(compiled.model).get(z) for z in n.input[2:4])
                   for n in compiled.model.graph.node if n.op_type == "MatMulInteger"}
    assert zero_points == {"xw": (u8, u8), "xy": (u8, u8)}  # uint8 zero points: uint8 operands
    assert _gemm_types(compiled.model)["xw"] == (u8, u8)  # the -128 weights moved to uint8 too
    assert compiled.counts["u8_copy"] == 3 and "3 int8 MatMulInteger operands as uint8 copies" in (
        compiled.describe())
    monkeypatch.setenv("IVIT_GEMM_PROBE_FAULT", "wrap")
    _same(make_runner("library", model, 1).run(feeds), want)
