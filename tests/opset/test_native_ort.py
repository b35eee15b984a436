"""The native onnxruntime custom-op library (``opset/native/ort_ops.cpp``) loaded by onnxruntime itself.

* In a fresh process, ``register_custom_ops_library(path)`` and nothing else of the project in the
  session: every op on every pair of input/output dtypes (every triple for IAdd), examples from the
  property-test generators of :mod:`tests.opset.test_bitexact`, bit-exact against the reference kernel.
  ``python -m tests.opset.test_native_ort LIB [EXAMPLES]`` is that process; it prints a JSON summary.
* The same process with a build under ``-fsanitize=address,undefined`` (libasan preloaded).
* The API-version check at load: an onnxruntime that does not serve the library's API version gets a
  message, not a crash (a fake ``OrtApiBase`` standing in for a too old and a too new runtime).
* Refusals at session creation (dtypes, attributes) and at run time (shapes that do not broadcast),
  each naming the node; large tensors on onnxruntime's thread pool and concurrent runs of one session.
"""

from __future__ import annotations

import ctypes
import importlib.util
import itertools
import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import HealthCheck, given, settings
from onnx import TensorProto, helper

from ivit_onnx.opset import OPS, native_kernels
from ivit_onnx.opset.ort_library import native_library
from ivit_onnx.opset.shift_exp import max_n
from tests.opset.oneop import INT_DTYPES, one_node_model, poly_softmax_params

ROOT = Path(__file__).resolve().parents[2]
SOURCES = Path(native_kernels.__file__).resolve().parent / "native"
needs_library = pytest.mark.skipif(native_library() is None, reason="native library not built")


# ---------------------------------------------------------------------------- the fresh-process check


def op_dtype_cases():
    """``(op, dtypes, strategy)`` for every op and every dtype pair (IAdd: a, b, y triples)."""
    from tests.opset import test_bitexact as tb

    pairs = list(itertools.product(INT_DTYPES, INT_DTYPES))
    for xt, yt in pairs:
        yield "Requantize", (xt, yt), tb.requantize_cases(xt, yt)
        yield "Shiftmax", (xt, yt), tb.shiftmax_cases(xt, yt)
        yield "ShiftGELU", (xt, yt), tb.shiftgelu_cases(xt, yt)
        yield "ILayerNorm", (xt, yt), tb.ilayernorm_cases(xt, yt)
        yield "IBertGELU", (xt, yt), tb.ibertgelu_cases(xt, yt)
        yield "L1LayerNorm", (xt, yt), tb.l1layernorm_cases(xt, yt)
        yield "IL2Norm", (xt, yt), tb.il2norm_cases(xt, yt)
        for op in ("IBertSoftmax", "LogIntSoftmax"):
            yield op, (xt, yt), tb.poly_softmax_cases(op, xt, yt)
    for at, bt, yt in itertools.product(INT_DTYPES, repeat=3):
        yield "IAdd", (at, bt, yt), tb.iadd_cases(at, bt, yt)


def library_session(model: onnx.ModelProto, lib: str, threads: int = 1) -> ort.InferenceSession:
    """A session with only ``lib`` registered; the ``ai.ivit`` function bodies are dropped so that every
    private op must run in the library (a missing kernel is an error, never a silent fallback)."""
    bare = onnx.ModelProto()
    bare.CopyFrom(model)
    del bare.functions[:]
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.log_severity_level = 3
    opts.register_custom_ops_library(lib)
    return ort.InferenceSession(bare.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def check_every_pair(lib: str, examples: int) -> dict:
    """Run every (op, dtypes) case through ``lib`` in onnxruntime; failures are collected, not raised."""
    checked: dict[str, int] = {}
    failures: list[str] = []

    def check(op: str, key: str, case) -> None:
        inputs, attrs = case
        ref = OPS[op].run(*inputs, **attrs)
        try:
            model, feeds = one_node_model(OPS[op], inputs, attrs, out_shape=ref.shape)
            got = library_session(model, lib, threads=2).run(None, feeds)[0]
        except Exception as e:  # noqa: BLE001 - reported with the case
            failures.append(f"{key}: {type(e).__name__}: {str(e)[:300]}")
            return
        checked[key] += 1
        if got.dtype != ref.dtype or got.shape != ref.shape or not np.array_equal(got, ref):
            bad = int(np.sum(got != ref)) if got.shape == ref.shape else -1
            failures.append(
                f"{key}: {got.dtype}{got.shape} vs {ref.dtype}{ref.shape}, {bad} differ; "
                f"shapes {[np.shape(i) for i in inputs]}, attrs {attrs}"
            )

    def checker(op: str, key: str):
        return lambda case: check(op, key, case)

    run = settings(
        max_examples=examples,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    for op, dts, strategy in op_dtype_cases():
        key = f"{op}:" + ",".join(np.dtype(d).name for d in dts)
        checked[key] = 0
        run(given(case=strategy)(checker(op, key)))()
    return {"checked": checked, "failures": failures}


def run_fresh(lib: str, examples: int, env: dict | None = None, timeout: int = 900) -> dict:
    """:func:`check_every_pair` in a new Python process (the library loaded there for the first time)."""
    full_env = {**os.environ, "IVIT_NATIVE_LIB": lib, **(env or {})}
    proc = subprocess.run(
        [sys.executable, "-m", "tests.opset.test_native_ort", lib, str(examples)],
        cwd=ROOT,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stderr[-4000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def assert_all_pairs_pass(summary: dict) -> None:
    assert not summary["failures"], "\n".join(summary["failures"][:20])
    n_cases = sum(1 for _ in op_dtype_cases())
    assert len(summary["checked"]) == n_cases == (len(OPS) - 1) * 16 + 64  # IAdd: dtype triples
    missing = [k for k, n in summary["checked"].items() if n == 0]
    assert not missing, f"no example ran for {missing}"


@needs_library
def test_fresh_process_every_op_and_dtype_pair():
    assert_all_pairs_pass(run_fresh(native_library(), examples=3))


def _setup_sources() -> list[str]:
    """setup.py's SOURCES, the library's C++ files (its setup() runs only as __main__)."""
    spec = importlib.util.spec_from_file_location("ivit_setup", ROOT / "setup.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.SOURCES


@pytest.mark.skipif(
    not (SOURCES / "ort_ops.cpp").exists() or shutil.which("g++") is None,
    reason="needs the C++ sources and g++",
)
@pytest.mark.slow
def test_sanitized_build_on_every_op_and_dtype_pair(tmp_path):
    """The library built with -fsanitize=address,undefined (any report aborts) passes the same check, and the
    fused ops', the attention GEMMs', QGemm's residual stage's, the Shiftmax rows' and the patch input's tests
    (tests/opset/test_native_fused.py, test_qbatch.py, test_qgemm_add.py, test_index_shiftmax.py,
    tests/engines/test_patch_quantize.py).

    Marked slow (about two minutes, mostly compiling); ``.ci/run`` runs it as a step of its own.
    """
    libasan = subprocess.run(
        ["g++", "-print-file-name=libasan.so"], capture_output=True, text=True
    ).stdout.strip()
    if not os.path.isabs(libasan) or not os.path.exists(libasan):
        pytest.skip("no libasan for g++")
    lib = tmp_path / "ivit_ort_asan.so"
    build = subprocess.run(
        [
            "g++",
            "-std=c++17",
            "-O0",  # the template-heavy kernels compile in ~1.5 min at -O0 (3x at -O1); the run takes seconds
            "-DIVIT_NO_CLONES",  # one instruction set: the clones are the same source
            "-fwrapv",
            "-pthread",
            "-fPIC",
            "-shared",
            "-fsanitize=address,undefined",
            "-fno-sanitize-recover=all",
            "-fno-omit-frame-pointer",
            *(str(ROOT / f) for f in _setup_sources()),
            "-o",
            str(lib),
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert build.returncode == 0, build.stderr[-3000:]
    env = {
        "LD_PRELOAD": libasan,
        "ASAN_OPTIONS": "detect_leaks=0:halt_on_error=1",
        "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1",
    }
    assert_all_pairs_pass(run_fresh(str(lib), examples=2, env=env))
    # the fused ops of ai.ivit.fused and QBatchMatMul on their own tests, but for the refusals: a C++
    # throw aborts under a preloaded libasan (its __cxa_throw interceptor finds no real one), so refusals are
    # not run here. The process ends with os._exit: onnxruntime's pool threads can outlive the exit handlers
    # (a use-after-free inside onnxruntime at exit, seen under ASAN), which is not what this checks.
    args = ["-q", "-p", "no:cacheprovider", "-k",
            "not refused and not bad_operands and not refusals and not haswell",
            "tests/opset/test_native_fused.py", "tests/opset/test_qbatch.py", "tests/opset/test_qgemm_add.py",
            "tests/opset/test_index_shiftmax.py", "tests/engines/test_patch_quantize.py"]
    script = f"import os, sys, pytest\ncode = pytest.main({args!r})\nsys.stdout.flush()\nos._exit(code)"
    fused = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env={**os.environ, "IVIT_NATIVE_LIB": str(lib), **env},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert fused.returncode == 0, (fused.stdout + fused.stderr)[-4000:]


# ------------------------------------------------------------------------------- the version check

_GETAPI = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_uint32)
_GETVERSION = ctypes.CFUNCTYPE(ctypes.c_void_p)
_CREATE_STATUS = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p)
_SENTINEL = 0x5EED


class _ApiBase(ctypes.Structure):
    _fields_ = [("GetApi", _GETAPI), ("GetVersionString", _GETVERSION)]


def register_with_fake_runtime(version: str, serves: set[int]) -> tuple[int | None, list]:
    """Call RegisterCustomOps with an OrtApiBase whose GetApi serves only the API versions ``serves``
    (a table holding just CreateStatus, which records its message). Returns (status, messages)."""
    lib = ctypes.CDLL(native_library())
    lib.RegisterCustomOps.restype = ctypes.c_void_p
    lib.RegisterCustomOps.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    messages = []

    def create_status(code, msg):
        messages.append((code, msg.decode()))
        return _SENTINEL

    keep = [_CREATE_STATUS(create_status), ctypes.create_string_buffer(version.encode())]
    table = (ctypes.c_void_p * 300)(ctypes.cast(keep[0], ctypes.c_void_p).value)
    keep += [
        table,
        _GETAPI(lambda v: ctypes.addressof(table) if v in serves else None),
        _GETVERSION(lambda: ctypes.addressof(keep[1])),
    ]
    base = _ApiBase(keep[3], keep[4])
    status = lib.RegisterCustomOps(None, ctypes.byref(base))
    return status, messages


@needs_library
@pytest.mark.parametrize("version,serves", [("1.16.3", set(range(1, 17))), ("2.0.0", {1, 30, 31})])
def test_version_mismatch_is_a_message(version, serves):
    """Too old (no API 17 yet) or too new (API 17 dropped): an error status naming both versions."""
    status, messages = register_with_fake_runtime(version, serves)
    assert status == _SENTINEL and len(messages) == 1
    code, msg = messages[0]
    assert code != 0 and f"onnxruntime {version}" in msg and "API version 17" in msg


@needs_library
def test_version_mismatch_without_any_api(capfd):
    """A runtime serving no API version at all: nothing registered, a line on stderr, no crash."""
    status, messages = register_with_fake_runtime("9.9.9", set())
    assert status is None and not messages
    assert "onnxruntime 9.9.9" in capfd.readouterr().err


@needs_library
def test_installed_runtime_serves_the_library_version():
    """The onnxruntime this project pins (1.31) serves API version 17, and CreateStatus sits at slot 0."""
    lib = ctypes.CDLL(str(next(Path(ort.__file__).parent.glob("capi/libonnxruntime.so*"))))
    lib.OrtGetApiBase.restype = ctypes.POINTER(_ApiBase)
    api_base = lib.OrtGetApiBase().contents
    table = ctypes.cast(api_base.GetApi(17), ctypes.POINTER(ctypes.c_void_p))
    assert table
    create = _CREATE_STATUS(table[0])
    message = ctypes.CFUNCTYPE(ctypes.c_char_p, ctypes.c_void_p)(table[2])  # GetErrorMessage
    release = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(table[93])  # ReleaseStatus
    status = create(2, b"probe")
    assert message(status) == b"probe"
    release(status)


# ----------------------------------------------------------------------- refusals with a message


def bare_model(op: str, inputs: list[tuple[str, int, list]], attrs: dict, out_type: int) -> onnx.ModelProto:
    """One ``ai.ivit`` node, no function bodies: inputs are (name, onnx type, shape) graph inputs."""
    node = helper.make_node(op, [n for n, _, _ in inputs], ["y"], name="the_node", domain="ai.ivit", **attrs)
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [helper.make_tensor_value_info("y", out_type, None)],
    )
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.ivit", 1)], ir_version=10
    )


REQ_INPUTS = [
    ("x", TensorProto.INT8, [2, 3]),
    ("zx", TensorProto.INT8, []),
    ("b", TensorProto.INT64, []),
    ("c", TensorProto.INT64, []),
    ("zy", TensorProto.UINT8, []),
]


@needs_library
@pytest.mark.parametrize(
    "change,expected",
    [
        (
            {0: ("x", TensorProto.FLOAT, [2, 3])},
            "input 0 is float, the opset allows int8, uint8, int16 or int32",
        ),
        ({4: ("zy", TensorProto.INT64, [])}, "input 4 is int64, the opset allows int8"),
    ],
)
def test_dtype_refused_at_session_creation(change, expected):
    inputs = [change.get(i, p) for i, p in enumerate(REQ_INPUTS)]
    model = bare_model("Requantize", inputs, {"qmin": 0, "qmax": 255}, inputs[4][1])
    with pytest.raises(Exception, match="ai.ivit Requantize node 'the_node' refused") as info:
        library_session(model, native_library())
    assert expected in str(info.value)


@needs_library
@pytest.mark.parametrize(
    "attrs,expected",
    [
        ({"x0": 10, "n": 5, "bits": 40}, "attribute bits=40 is outside 1..30"),
        ({"x0": 0, "n": 5, "bits": 8}, "attribute x0=0 is outside"),
        ({"x0": 10, "bits": 8}, "missing int attribute 'n'"),
    ],
)
def test_attribute_refused_at_session_creation(attrs, expected):
    model = bare_model(
        "Shiftmax",
        [("x", TensorProto.INT32, [2, 5]), ("zy", TensorProto.UINT8, [])],
        attrs,
        TensorProto.UINT8,
    )
    with pytest.raises(Exception, match="ai.ivit Shiftmax node 'the_node' refused") as info:
        library_session(model, native_library())
    assert expected in str(info.value)


@needs_library
@pytest.mark.parametrize(
    "op,attrs,expected",
    [
        ("IBertGELU", {"clip": 50, "coeff": 2800, "k": 63}, "attribute k=63 is outside 0..62"),
        ("IBertGELU", {"clip": -1, "coeff": 2800, "k": 2}, "attribute clip=-1 is outside"),
        ("IBertGELU", {"clip": 50, "k": 2}, "missing int attribute 'coeff'"),
        ("L1LayerNorm", {"shift_in": 8, "p": 62}, "attribute p=62 is outside 0..61"),
        ("L1LayerNorm", {"shift_in": 63, "p": 30}, "attribute shift_in=63 is outside 0..62"),
    ],
)
def test_ablation_attribute_refused_at_session_creation(op, attrs, expected):
    i64 = TensorProto.INT64
    params = [("b", i64, []), ("c", i64, [])] + ([("bias", i64, [])] if op == "L1LayerNorm" else [])
    model = bare_model(
        op,
        [("x", TensorProto.INT8, [2, 5]), *params, ("zy", TensorProto.INT8, [])],
        {**attrs, "qmin": -128, "qmax": 127},
        TensorProto.INT8,
    )
    with pytest.raises(Exception, match=f"ai.ivit {op} node 'the_node' refused") as info:
        library_session(model, native_library())
    assert expected in str(info.value)


@needs_library
def test_shapes_that_do_not_broadcast_fail_the_run_with_a_message():
    i8, i64 = TensorProto.INT8, TensorProto.INT64
    inputs = [
        ("a", i8, None),
        ("b", i8, None),
        ("za", i8, []),
        ("zb", i8, []),
        ("ma", i64, []),
        ("mb", i64, []),
        ("c", i64, []),
        ("zy", i8, []),
    ]
    sess = library_session(bare_model("IAdd", inputs, {"qmin": -128, "qmax": 127}, i8), native_library())
    feeds = {n: np.zeros([], helper.tensor_dtype_to_np_dtype(t)) for n, t, _ in inputs}
    feeds.update(a=np.zeros((2, 3), np.int8), b=np.zeros((4,), np.int8))
    with pytest.raises(
        Exception, match=r"ai.ivit IAdd node 'the_node': input 1 of shape \[4\] does not broadcast"
    ):
        sess.run(None, feeds)


def broadcast_cases():
    """Calls outside the fused kernels' layouts (x broadcast against its parameters, a y_zero_point per
    column): the library's general broadcast loop."""
    rng = np.random.default_rng(5)
    x = rng.integers(-3000, 3000, (3, 1)).astype(np.int32)
    b = rng.integers(1 << 18, 1 << 22, (5,)).astype(np.int64)
    c = rng.integers(36, 45, (5,)).astype(np.int64)
    zy = rng.integers(-5, 5, (5,)).astype(np.int8)
    gelu = {"qmin": -128, "qmax": 127}
    yield "ShiftGELU", [x, b, c, zy], {"x0": 300, "n": max_n(300, 1), "bits": 14, **gelu}
    yield "IBertGELU", [x, b, c, zy], {"clip": 1051, "coeff": 1221607, "k": 6, **gelu}
    bias = rng.integers(-(1 << 40), 1 << 40, (5,)).astype(np.int64)
    rows = rng.integers(-128, 128, (3, 4, 1)).astype(np.int8)  # rows of 1, normalized then broadcast to 5
    for op in ("ILayerNorm", "L1LayerNorm"):
        yield op, [rows, b, c, bias, zy], {"shift_in": 16, "p": 30, **gelu}


@needs_library
@pytest.mark.parametrize("case", list(broadcast_cases()), ids=lambda c: c[0])
def test_broadcast_layouts_match_the_reference(case):
    op, inputs, attrs = case
    ref = OPS[op].run(*inputs, **attrs)
    assert ref.shape[-1] == 5 and np.asarray(inputs[0]).shape[-1] == 1
    model, feeds = one_node_model(OPS[op], inputs, attrs, out_shape=ref.shape)
    got = library_session(model, native_library()).run(None, feeds)[0]
    assert got.dtype == ref.dtype and np.array_equal(got, ref)


# --------------------------------------------------------------- onnxruntime's pool, concurrent runs

RNG = np.random.default_rng(20261123)


def big_cases():
    """Tensors large enough to be split into many chunks on the pool, per-channel parameters included."""
    x = RNG.integers(-3000, 3000, (8, 197, 192)).astype(np.int32)
    b = RNG.integers(1 << 18, 1 << 22, (192,)).astype(np.int64)
    c = RNG.integers(30, 40, (192,)).astype(np.int64)
    yield "Requantize", [x, np.int32(3), b, c, np.int8(-2)], {"qmin": -128, "qmax": 127}
    yield "Requantize", [x, np.int32(0), b[:1], c[:1], np.uint8(128)], {"qmin": 0, "qmax": 255}
    yield (
        "ShiftGELU",
        [x, b, c, np.uint8(0)],
        {"x0": 300, "n": max_n(300, 1), "bits": 14, "qmin": 0, "qmax": 255},
    )
    s = RNG.integers(-2000, 2000, (8, 3, 197, 197)).astype(np.int32)
    yield "Shiftmax", [s, np.uint8(0)], {"x0": 1000, "n": max_n(1000, 197), "bits": 8}
    poly = poly_softmax_params(7e-4, 197, 8)
    yield "IBertSoftmax", [s, np.uint8(0)], poly
    yield "LogIntSoftmax", [s, np.uint8(0)], {**poly, "log_bits": 4}
    a = RNG.integers(-128, 128, (8, 197, 192)).astype(np.int8)
    yield (
        "IAdd",
        [
            a,
            a[:1] // 2,
            np.int8(1),
            np.int8(-1),
            np.int64(3 << 40),
            np.int64(5 << 39),
            np.int64(44),
            np.int8(0),
        ],
        {"qmin": -128, "qmax": 127},
    )
    bias = RNG.integers(-(1 << 40), 1 << 40, (192,)).astype(np.int64)
    yield "ILayerNorm", [a, b, c + 20, bias, np.int8(0)], {"shift_in": 16, "p": 30, "qmin": -128, "qmax": 127}
    ln_attrs = {"shift_in": 16, "p": 30, "qmin": -128, "qmax": 127}
    yield "L1LayerNorm", [a, b, c + 20, bias, np.int8(0)], ln_attrs
    yield (
        "IBertGELU",
        [x, b, c + 10, np.uint8(0)],
        {"clip": 2500, "coeff": 7_000_000, "k": 8, "qmin": 0, "qmax": 255},
    )


@needs_library
@pytest.mark.parametrize("case", list(big_cases()), ids=lambda c: c[0])
def test_pool_and_concurrent_runs_match_the_reference(case):
    op, inputs, attrs = case
    ref = OPS[op].run(*inputs, **attrs)
    model, feeds = one_node_model(OPS[op], inputs, attrs, out_shape=ref.shape)
    for threads in (1, 3):
        assert np.array_equal(library_session(model, native_library(), threads).run(None, feeds)[0], ref)
    sess = library_session(model, native_library(), threads=2)
    results = [None] * 4

    def run(i):
        results[i] = sess.run(None, feeds)[0]

    workers = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert all(r is not None and np.array_equal(r, ref) for r in results)


if __name__ == "__main__":
    print(json.dumps(check_every_pair(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 3)))


# ------------------------------------------------------------------------------- bias folding


def gemm_bias_requantize(w: np.ndarray, bias: np.ndarray, za_shape=()) -> onnx.ModelProto:
    """``Requantize(Add(MatMulInteger(a, w, 128, 0), bias), zx=3, b, c, zy)``, the converter's pattern."""
    from ivit_onnx.opset.functions import attach_functions

    inits = [
        onnx.numpy_helper.from_array(w, "w"),
        onnx.numpy_helper.from_array(np.full(za_shape, 128, np.uint8), "za"),
        onnx.numpy_helper.from_array(np.int8(0), "zw"),
        onnx.numpy_helper.from_array(bias, "bias"),
        onnx.numpy_helper.from_array(np.int32(3), "zx"),
        onnx.numpy_helper.from_array(RNG.integers(1 << 20, 1 << 24, w.shape[1]).astype(np.int64), "b"),
        onnx.numpy_helper.from_array(np.full(w.shape[1], 36, np.int64), "c"),
        onnx.numpy_helper.from_array(np.int8(-1), "zy"),
    ]
    nodes = [
        helper.make_node("MatMulInteger", ["a", "w", "za", "zw"], ["acc"], name="mm"),
        helper.make_node("Add", ["acc", "bias"], ["biased"], name="add"),
        OPS["Requantize"].make_node(["biased", "zx", "b", "c", "zy"], ["y"], name="rq", qmin=-128, qmax=127),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("a", TensorProto.UINT8, [4, 5, w.shape[0]])],
        [helper.make_tensor_value_info("y", TensorProto.INT8, None)],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    attach_functions(model)
    return model


@needs_library
def test_bias_fold_is_exact_and_only_where_provable():
    from ivit_onnx.engines.onnxruntime.bias_fold import fold_bias
    from ivit_onnx.opset.ort_library import session

    w = RNG.integers(-128, 128, (64, 48)).astype(np.int8)
    bias = RNG.integers(-(1 << 20), 1 << 20, 48).astype(np.int32)
    model = gemm_bias_requantize(w, bias)
    feeds = {"a": RNG.integers(0, 256, (4, 5, 64)).astype(np.uint8)}
    folded, n = fold_bias(model)
    assert n == 1 and [x.op_type for x in folded.graph.node] == ["MatMulInteger", "Requantize"]
    want = session(model, "functions").run(None, feeds)[0]
    assert np.array_equal(session(folded, "library").run(None, feeds)[0], want)
    assert fold_bias(model, keep={"biased"})[1] == 0  # a tensor someone reads stays
    huge = np.full(48, (1 << 31) - 1000, np.int32)  # acc + bias could wrap in int32: left alone
    assert fold_bias(gemm_bias_requantize(w, huge))[1] == 0
    assert fold_bias(gemm_bias_requantize(w, bias, za_shape=(1,)))[1] == 1  # a one-element vector zero point


@pytest.mark.parametrize("zw", [None, "scalar"])  # onnxruntime has no per-channel ConvInteger
def test_patch_conv_as_gemm_is_exact(zw):
    from ivit_onnx.engines.onnxruntime.patch_gemm import patch_gemm

    w = RNG.integers(-128, 128, (5, 3, 4, 4)).astype(np.int8)
    inits = [onnx.numpy_helper.from_array(w, "w"), onnx.numpy_helper.from_array(np.uint8(128), "zx")]
    inputs = ["x", "w", "zx"]
    if zw is not None:
        inits.append(onnx.numpy_helper.from_array(np.int8(3), "zw"))
        inputs.append("zw")
    node = helper.make_node("ConvInteger", inputs, ["y"], kernel_shape=[4, 4], strides=[4, 4])
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.UINT8, ["n", 3, 8, 12])],
        [helper.make_tensor_value_info("y", TensorProto.INT32, None)],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    patched, n = patch_gemm(model)
    assert n == 1 and "ConvInteger" not in {x.op_type for x in patched.graph.node}
    feeds = {"x": RNG.integers(0, 256, (2, 3, 8, 12)).astype(np.uint8)}

    from onnx.reference import ReferenceEvaluator

    from ivit_onnx.runners import exact_weight_gemms

    opts = ort.SessionOptions()
    exact_weight_gemms(opts)  # onnxruntime's uint8 x int8 kernel saturates without VNNI
    got = ort.InferenceSession(patched.SerializeToString(), opts, providers=["CPUExecutionProvider"]).run(
        None, feeds
    )[0]
    assert np.array_equal(got, ReferenceEvaluator(model).run(None, feeds)[0])
