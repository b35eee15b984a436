"""The GEMM self-check decides per form, on any CPU: ``IVIT_GEMM_PROBE_FAULT=wrap`` makes the int8 x int8
forms count as wrong, as they are on ARM cores without a dot product (Cortex-A72, A64FX; tests/arm/run.sh
sees the real ones under QEMU). The library then registers for the uint8 forms a compiled model runs and
records every form; ``InferenceSession`` falls back to exact forms with one warning line, or fails in one
error line; the functions backend runs its int8 x int8 GEMMs as uint8. Also: ARM cores named from
/proc/cpuinfo, and the install markers that keep the README's first command resolvable on Linux aarch64."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import tomllib
from onnx import TensorProto, helper, numpy_helper

from ivit_onnx import cpu, int8_gemms
from ivit_onnx.errors import ConversionError
from ivit_onnx.opset import gemm_probe, native_kernels, ort_library

ROOT = Path(__file__).resolve().parents[2]
needs_library = pytest.mark.skipif(not native_kernels.available(), reason="the native library was not built")


sys.path.insert(0, str(ROOT / "tests" / "arm"))
try:  # the same registration as the ARM checks (which run without pytest)
    from exactness import register as _register
finally:
    sys.path.pop(0)


@needs_library
def test_record_names_every_form():
    record, error = _register("0")
    assert not error
    forms = record.split("; forms: ")[1].split(", ")
    assert [f.split(" ")[0] for f in forms] == list(gemm_probe.FORMS)
    assert all(f.split(" ")[1] in ("exact", "inexact") for f in forms)


@needs_library
def test_wrapping_int8_refused_only_where_it_runs(monkeypatch):
    monkeypatch.setenv("IVIT_GEMM_PROBE_FAULT", "wrap")
    record, error = _register("0")  # a compiled artifact: uint8 forms only
    assert not error and record.startswith("uint8 GEMMs exact")
    assert "s8s8 inexact" in record and "u8u8 exact" in record
    for declared in ("1", None):  # the model as converted, or unknown: int8 x int8 may run
        record, error = _register(declared)
        line = error[error.index("ai.ivit custom-op library:"):]
        assert "\n" not in line.strip() and "int8 x int8 GEMM is not exact" in line
        assert f"{ort_library.INT8_GEMMS}=0" in line and "s8s8 inexact" in record


@needs_library
def test_no_exact_form_refused_without_alternative(monkeypatch):
    monkeypatch.setenv("IVIT_GEMM_PROBE_FAULT", "all")
    for declared in ("0", "1", None):
        _, error = _register(declared)
        assert "no exact integer path" in error and "ivit.int8_gemms=" not in error


def _int8_gemms_model() -> tuple[onnx.ModelProto, dict, np.ndarray]:
    """x (int8 activations) times y (activations) and times w (weights with -128), all at -128."""
    k, n = 64, 6
    w = np.full((k, n), -128, np.int8)
    w[:, 1::2] = 127
    ins = [helper.make_tensor_value_info("x", TensorProto.INT8, [2, k]),
           helper.make_tensor_value_info("y", TensorProto.INT8, [k, n])]
    outs = [helper.make_tensor_value_info(o, TensorProto.INT32, [2, n]) for o in ("xy", "xw", "xv")]
    zp = numpy_helper.from_array(np.array(3, np.int8), "zp")
    v = numpy_helper.from_array(np.full((k, n), 5, np.int8), "v")  # weights without -128: they stay int8
    nodes = [helper.make_node("MatMulInteger", ["x", "y", "zp"], ["xy"], name="xy"),
             helper.make_node("MatMulInteger", ["x", "w"], ["xw"], name="xw"),
             helper.make_node("MatMulInteger", ["x", "v"], ["xv"], name="xv")]
    g = helper.make_graph(nodes, "int8_gemms", ins, outs, [numpy_helper.from_array(w, "w"), zp, v])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    feeds = {"x": np.full((2, k), -128, np.int8), "y": np.full((k, n), -128, np.int8)}
    x = feeds["x"].astype(np.int64)
    want = [(x - 3) @ feeds["y"].astype(np.int64), x @ w.astype(np.int64), x @ np.full((k, n), 5)]
    return m, feeds, want


def test_functions_backend_runs_int8_gemms_as_uint8_where_they_wrap(monkeypatch):
    model, feeds, want = _int8_gemms_model()
    rewritten, changed = int8_gemms.as_uint8(model)
    assert changed == 3
    types = {t.name: t.data_type for t in rewritten.graph.initializer}
    gemms = [n for n in rewritten.graph.node if n.op_type == "MatMulInteger"]
    assert types["v"] == TensorProto.INT8 and "v" in [n.input[1] for n in gemms]
    sess = ort.InferenceSession(rewritten.SerializeToString(), providers=["CPUExecutionProvider"])
    assert all(np.array_equal(g, w) for g, w in zip(sess.run(None, feeds), want, strict=True))
    int8_gemms.probe.cache_clear()
    monkeypatch.setenv("IVIT_GEMM_PROBE_FAULT", "wrap")
    try:
        assert "s8s8" in int8_gemms.wraps()
        assert int8_gemms.exact_int8_gemms(model) is not model
        got = ort_library.session(model, "functions").run(None, feeds)
        assert all(np.array_equal(g, w) for g, w in zip(got, want, strict=True))
    finally:
        int8_gemms.probe.cache_clear()
    monkeypatch.delenv("IVIT_GEMM_PROBE_FAULT")
    if not int8_gemms.wraps():  # this CPU's int8 x int8 is exact: the model runs as converted
        assert int8_gemms.exact_int8_gemms(model) is model


@pytest.fixture(scope="module")
def digits_int(tmp_path_factory) -> Path:
    from ivit_onnx import cli

    path = tmp_path_factory.mktemp("digits") / "int.onnx"
    assert cli.main(["rewrite", "digits", "-o", str(path)]) == 0
    return path


def _x(path: Path) -> dict:
    g = onnx.load(str(path)).graph
    dims = [d.dim_value or 2 for d in g.input[0].type.tensor_type.shape.dim]
    return {g.input[0].name: np.random.default_rng(0).uniform(0, 16, dims).astype(np.float32)}


@needs_library
def test_session_falls_back_to_uint8_forms_in_one_warning(digits_int, monkeypatch, capsys):
    from ivit_onnx import InferenceSession

    monkeypatch.setenv("IVIT_GEMM_PROBE_FAULT", "wrap")
    capsys.readouterr()
    sess = InferenceSession(str(digits_int), threads=1, u8_gemm=False)  # asks for int8 x int8, which wraps
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "int8 x int8 GEMMs are not exact on" in err[0]
    assert "uint8 GEMMs (exact)" in err[0]
    assert sess.compiled.uint8_gemms and "s8s8 inexact" in sess.gemm_check
    feeds = _x(digits_int)
    want = ort_library.session(onnx.load(str(digits_int)), "functions").run(None, feeds)
    assert all(np.array_equal(g, w) for g, w in zip(sess.run(None, feeds), want, strict=True))


@needs_library
def test_session_without_exact_forms_fails_in_one_line(digits_int, monkeypatch):
    from ivit_onnx import InferenceSession

    monkeypatch.setenv("IVIT_GEMM_PROBE_FAULT", "all")
    with pytest.raises(ConversionError) as err:
        InferenceSession(str(digits_int), threads=1)
    msg = str(err.value)
    assert msg.startswith("ai.ivit custom-op library:") and "\n" not in msg and "no exact integer path" in msg
    assert err.value.__cause__ is None and err.value.__suppress_context__


def test_cli_run_refusal_is_one_line(digits_int, monkeypatch, capsys):
    from ivit_onnx import cli

    if not native_kernels.available():
        pytest.skip("the native library was not built")
    monkeypatch.setenv("IVIT_GEMM_PROBE_FAULT", "all")
    assert cli.main(["run", str(digits_int)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("ivit-onnx: error: ai.ivit custom-op library:")


def _cpuinfo(model: str) -> str:
    sys.path.insert(0, str(ROOT / "tests" / "arm"))
    try:
        from cpuinfo import cpuinfo
    finally:
        sys.path.pop(0)
    return cpuinfo(model, real=True)


@pytest.mark.parametrize("model,name", [("cortex-a72", "Cortex-A72"), ("cortex-a76", "Cortex-A76"),
                                        ("a64fx", "A64FX"), ("neoverse-n1", "Neoverse-N1"),
                                        ("max", "an ARM64 CPU (MIDR implementer 0x00, part 0x051)")])
def test_arm_core_named_from_midr(model, name):
    assert cpu.arm_core(_cpuinfo(model)) == name


def test_arm_core_tables_agree():
    """gemm_check.cpp names cores with the same table as cpu.py."""
    src = (ROOT / "opset" / "native" / "gemm_check.cpp").read_text()
    rows = re.findall(r'\{(0x[0-9a-f]+), (0x[0-9a-f]+), "([^"]+)"\}', src)
    table = {(int(i, 16), int(p, 16)): n for i, p, n in rows}
    assert table == cpu.ARM_CORES


def test_install_markers_skip_only_what_linux_aarch64_cannot_install():
    from packaging.requirements import Requirement

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = [Requirement(r) for extra in project["optional-dependencies"].values() for r in extra]
    arm = {"platform_machine": "aarch64", "sys_platform": "linux", "platform_system": "Linux"}
    x86 = {**arm, "platform_machine": "x86_64"}
    skipped = {r.name for r in reqs if r.marker is not None and not r.marker.evaluate(arm)}
    assert {"openvino", "onnxoptimizer"} <= skipped
    assert all(r.marker is None or r.marker.evaluate(x86) for r in reqs if r.name in skipped - {"xgboost"})
    assert skipped - {"openvino", "onnxoptimizer", "xgboost"} == set()
