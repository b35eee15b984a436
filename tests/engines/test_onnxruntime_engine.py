"""The onnxruntime engine's artifact (:mod:`ivit_onnx.engines.onnxruntime`): a plain onnxruntime session with
only the library registered, and ``ivit_onnx.InferenceSession``, give the function bodies' bits."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import ivit_onnx
from ivit_onnx.engines.onnxruntime import compile_model, is_artifact
from ivit_onnx.opset import native_kernels, ort_library
from ivit_onnx.runners import OrtRunner
from tests.validate.conftest import x_batch

pytestmark = pytest.mark.skipif(not native_kernels.available(), reason="the native library was not built")


@pytest.fixture(scope="module")
def artifact(tiny, tmp_path_factory):
    path = tmp_path_factory.mktemp("ort") / "int.ort.onnx"
    compiled = compile_model(tiny.model())
    onnx.save(compiled.model, path)
    return path, compiled


def _bodies(tiny, x):
    return OrtRunner(tiny.model(), "functions", 1).run({"input": x})


def test_plain_session_with_only_the_library_registered_is_bit_exact(tiny, artifact):
    path, compiled = artifact
    assert is_artifact(onnx.load(path)) and compiled.uint8_gemms
    opts = ort.SessionOptions()
    opts.register_custom_ops_library(ort_library.native_library())
    sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    x = x_batch(6, seed=11)
    x[0] = 40.0  # saturating activations: the worst case of the 8-bit GEMMs
    got = sess.run(None, {"input": x})
    want = _bodies(tiny, x)
    assert [o.name for o in sess.get_outputs()] == list(want)
    assert all(np.array_equal(g, w) for g, w in zip(got, want.values(), strict=True))


def test_ivit_onnx_session_on_the_artifact_and_on_int_onnx(tiny, artifact):
    x = x_batch(4, seed=12)
    want = list(_bodies(tiny, x).values())
    for source in (artifact[0], tiny.int):
        sess = ivit_onnx.InferenceSession(source, threads=1)
        assert [i.name for i in sess.get_inputs()] == ["input"]
        got = sess.run(None, {"input": x})
        assert all(np.array_equal(g, w) for g, w in zip(got, want, strict=True)), source
        assert "GEMM self-check" in sess.describe()


def test_an_artifact_is_not_compiled_twice(artifact):
    with pytest.raises(ValueError, match="already compiled"):
        compile_model(artifact[1].model)


def test_shared_weights_get_copies_so_the_exact_kernels_load():
    """onnxruntime's int8 -> uint8 weight conversion (the exact path without VNNI) fails on a weight read by
    two GEMMs; the compile step gives each its own."""
    w = numpy_helper.from_array(np.full((8, 4), 127, np.int8), "w")
    nodes = [helper.make_node("MatMulInteger", ["a", "w"], [y]) for y in ("y1", "y2")]
    outs = [helper.make_tensor_value_info(y, TensorProto.INT32, None) for y in ("y1", "y2")]
    g = helper.make_graph(nodes, "shared", [helper.make_tensor_value_info("a", TensorProto.UINT8, [2, 8])],
                          outs, [w])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    compiled = compile_model(model)
    assert compiled.counts["unshared_weights"] == 1
    opts = ort.SessionOptions()
    opts.add_session_config_entry("session.x64quantprecision", "1")
    sess = ort.InferenceSession(compiled.model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    a = np.full((2, 8), 255, np.uint8)
    assert all((y == 255 * 127 * 8).all() for y in sess.run(None, {"a": a}))


def test_converted_model_with_shared_weights_loads_where_the_self_check_turns_on_exact_kernels(monkeypatch):
    """ALBERT shares its layers' weights: the converter's own output (not only the compiled artifact) must
    load in a plain session with the library where the self-check adds ``session.x64quantprecision=1``
    (x86 without VNNI; forced here on any CPU), and give the function bodies' bits."""
    from tests.graphs import G, run

    g = G()
    h = g.qdq(g.input("x", ["N", 4, 16]), 0.05)
    w = g.weight(np.random.default_rng(0).standard_normal((16, 16)), axis=1)
    for _ in range(2):  # one weight, two GEMMs
        h = g.qdq(g.node("MatMul", [h, w]), 0.2)
    g.output(h)
    out, report = ivit_onnx.rewrite(g.model())
    assert report.counts["finalize"]["shared GEMM weight copied"] == 1
    monkeypatch.setenv("IVIT_GEMM_PROBE_FAULT", "saturate")  # as on an AVX2 CPU, whatever this one is
    opts = ort.SessionOptions()
    opts.register_custom_ops_library(ort_library.native_library())
    assert opts.get_session_config_entry("session.x64quantprecision") == "1"
    sess = ort.InferenceSession(out.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    x = np.random.default_rng(1).standard_normal((2, 4, 16)).astype(np.float32) * 3
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], run(out, {"x": x})[0])


_PLAIN_RUN = """
import sys, numpy as np, onnxruntime as ort
from ivit_onnx.opset import ort_library
opts = ort.SessionOptions()
opts.register_custom_ops_library(ort_library.native_library())
sess = ort.InferenceSession(sys.argv[1], opts, providers=["CPUExecutionProvider"])
for _ in range(2):
    sess.run(None, {"input": np.zeros((2, 3, 32, 32), np.float32)})
"""


def _stderr_of_plain_runs(*paths) -> list[str]:
    runs = [subprocess.run([sys.executable, "-c", _PLAIN_RUN, str(p)], capture_output=True, text=True)
            for p in paths]
    assert all(r.returncode == 0 for r in runs), [r.stderr for r in runs]
    return [r.stderr.strip() for r in runs]


def test_plain_session_on_int_onnx_hints_once_at_the_compiled_artifact(tiny, artifact):
    """int.onnx as converted runs in a plain session (exact, ~3x slower): the library says once, on stderr,
    how to get the artifact; the artifact itself, and ivit-onnx's own sessions, run silently."""
    converted, compiled = _stderr_of_plain_runs(tiny.int, artifact[0])
    assert len(converted.splitlines()) == 1, converted
    assert "hint" in converted and "ivit-onnx compile" in converted and "InferenceSession" in converted
    assert compiled == ""
    ours = subprocess.run([sys.executable, "-c", "import sys, numpy as np, ivit_onnx; "
                           "ivit_onnx.InferenceSession(sys.argv[1]).run(None, "
                           "{'input': np.zeros((2, 3, 32, 32), np.float32)})", str(tiny.int)],
                          capture_output=True, text=True)
    assert ours.returncode == 0 and ours.stderr.strip() == "", ours.stderr
