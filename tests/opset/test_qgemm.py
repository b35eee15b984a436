"""The library's own 8-bit GEMM with Requantize fused (``opset/native/qgemm.cpp``, op ``ai.ivit.engine``
QGemm), bit for bit against numpy: MatMulInteger's int32 accumulator, then the Requantize reference (and
the table of QGemmTable).

Every instruction-set path (portable C++, AVX2 ``vpmaddwd``, AVX-512 VNNI ``vpdpbusd``, aarch64 NEON
``smlal``, aarch64 ``sdot``, aarch64 i8mm ``smmla``) is run through the C entry points with the path named,
and through onnxruntime with ``IVIT_GEMM_ISA`` forcing it; a path this CPU lacks is skipped with the reason
(``tests/arm/run.sh`` runs this file on emulated Cortex-A72 and Cortex-A76 cores, and its i8mm tests on QEMU's
``max``). Cases: int8 and uint8 activations, K in (1, 7, 64, 257, 1024), odd N, row counts across the kernel's
chunks, zero points, per-tensor and per-column parameters, operands at -128 / 127 / 255, 1 and 3 threads.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from ivit_onnx import cpu
from ivit_onnx.engines.onnxruntime.qgemm_fold import GEMM_PATHS
from ivit_onnx.opset import native_kernels
from ivit_onnx.opset.ort_library import INT8_GEMMS, native_library
from ivit_onnx.opset.requantize import reference as requantize

pytestmark = pytest.mark.skipif(not native_kernels.available(), reason="native library not built")
ISAS = GEMM_PATHS
CODES = {np.dtype(np.int8): 0, np.dtype(np.uint8): 1, np.dtype(np.int16): 2, np.dtype(np.int32): 3}
KS = (1, 7, 64, 257, 1024)
DOMAIN = "ai.ivit.engine"
ROOT = Path(__file__).resolve().parents[2]
#: how to start this Python in a subprocess: under QEMU user mode (no binfmt) tests/arm/run.sh names the
#: emulator command, which the guest starts as a host program
PYTHON = os.environ.get("IVIT_GUEST_PYTHON", "").split() or [sys.executable]


def _lib():
    lib = native_kernels._LIB
    p, i, c = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    lib.ivit_qgemm_supported.argtypes, lib.ivit_qgemm_supported.restype = [c], c
    lib.ivit_qgemm_usable.argtypes, lib.ivit_qgemm_usable.restype = [c], c
    lib.ivit_qgemm_create.argtypes = [c, c, i, i, p, p, i, i, p, p, p, i, i, i, i, p, c,
                                      ctypes.POINTER(ctypes.c_char_p)]
    lib.ivit_qgemm_create.restype = p
    lib.ivit_qgemm_isa.argtypes, lib.ivit_qgemm_isa.restype = [p], c
    lib.ivit_qgemm_epilogue.argtypes, lib.ivit_qgemm_epilogue.restype = [p], c
    lib.ivit_qgemm_run.argtypes, lib.ivit_qgemm_run.restype = [p, p, i, p, c], c
    lib.ivit_qgemm_destroy.argtypes = [p]
    return lib


def need(isa: str) -> None:
    if not _lib().ivit_qgemm_supported(ISAS[isa]):
        pytest.skip(f"this CPU lacks the {isa} path's instructions")


def reference(a, za, b, zb, zx, mult, shift, zy, qmin, qmax, table=None):
    """MatMulInteger (int32 accumulator, wrapping as an int32 matmul does), Requantize, then the table."""
    acc = ((a.astype(np.int64) - za) @ (b.astype(np.int64) - zb)).astype(np.int32)
    y = requantize(acc, np.int32(0) + zx, mult, shift, zy, qmin=qmin, qmax=qmax)
    return y if table is None else table[y.astype(np.int64) - qmin]


def case(rng, adt, k: int, n: int, rows: int, per_column: bool, out=np.int8, extremes=True):
    """Operands (at their extremes where ``extremes``) and converter-like Requantize parameters."""
    info = np.iinfo(adt)
    a = rng.integers(info.min, info.max + 1, (rows, k)).astype(adt)
    b = rng.integers(-128, 128, (k, n)).astype(np.int8)
    if extremes:
        a[rng.random(a.shape) < 0.5] = info.max if adt == np.uint8 else info.min
        a[rng.random(a.shape) < 0.2] = info.max
        b[rng.random(b.shape) < 0.4] = -128
        b[rng.random(b.shape) < 0.2] = 127
    size = n if per_column else 1
    za = adt(rng.integers(info.min, info.max + 1))
    zb = rng.integers(-128, 128, size).astype(np.int8)
    zx = rng.integers(-(1 << 20), 1 << 20, size).astype(np.int32)
    shift = rng.integers(0, 40, size).astype(np.int64)
    mult = (rng.integers(1, 1 << 24, size) * rng.choice([-1, 1], size)).astype(np.int64)
    o = np.iinfo(out)
    zy = out(rng.integers(max(o.min, -100), min(o.max, 100) + 1))
    qmin, qmax = int(o.min), int(o.max)
    if out == np.int8:
        qmin, qmax = -127, 120  # narrower than the type, as the converter's restricted ranges
    return dict(a=a, za=za, b=b, zb=zb, zx=zx, mult=mult, shift=shift, zy=zy, qmin=qmin, qmax=qmax)


def run_c(isa: str, c: dict, threads: int = 1, table=None, forms: list | None = None,
          paths: list | None = None) -> np.ndarray:
    """The GEMM through the C entry points, on ``isa`` ("auto": the library's pick; forms: gets the
    epilogue's, ivit_qgemm_epilogue; paths: the path it ran, ivit_qgemm_isa)."""
    lib = _lib()
    k, n = c["b"].shape
    arr = {key: np.ascontiguousarray(np.asarray(c[key]).reshape(-1).astype(np.int64))
           for key in ("zb", "zx", "mult", "shift")}
    nch = arr["zx"].size
    assert arr["mult"].size == arr["shift"].size == nch
    tab = None if table is None else np.ascontiguousarray(table.astype(np.int32))
    out_dt = np.asarray(c["zy"]).dtype if table is None else table.dtype
    err = ctypes.c_char_p()
    b = np.ascontiguousarray(c["b"])
    code = 0 if isa == "auto" else ISAS[isa]
    g = lib.ivit_qgemm_create(code, CODES[c["a"].dtype], k, n, b.ctypes.data, arr["zb"].ctypes.data,
                              arr["zb"].size, int(c["za"]), arr["zx"].ctypes.data, arr["mult"].ctypes.data,
                              arr["shift"].ctypes.data, nch, int(c["zy"]), c["qmin"], c["qmax"],
                              None if tab is None else tab.ctypes.data, CODES[np.dtype(out_dt)],
                              ctypes.byref(err))
    assert g, err.value
    try:
        assert isa == "auto" or lib.ivit_qgemm_isa(g) == ISAS[isa]
        if paths is not None:
            paths.append(lib.ivit_qgemm_isa(g))
        if forms is not None:
            forms.append(lib.ivit_qgemm_epilogue(g))
        a = np.ascontiguousarray(c["a"])
        y = np.zeros((a.shape[0], n), out_dt)
        assert lib.ivit_qgemm_run(g, a.ctypes.data, a.shape[0], y.ctypes.data, threads) == 0
        return y
    finally:
        lib.ivit_qgemm_destroy(g)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("adt", [np.int8, np.uint8])
@pytest.mark.parametrize("per_column", [False, True])
def test_paths_bit_exact(isa, adt, per_column):
    need(isa)
    rng = np.random.default_rng([KS[0], ISAS[isa], int(per_column), np.dtype(adt).num])
    for k in KS:
        for n, rows in ((1, 1), (17, 5), (33, 50), (63, 97)):
            c = case(rng, adt, k, n, rows, per_column)
            want = reference(**c)
            for threads in (1, 3):
                np.testing.assert_array_equal(run_c(isa, c, threads), want,
                                              err_msg=f"{isa} K={k} N={n} M={rows}")


@pytest.mark.parametrize("isa", ISAS)
def test_high_shifts(isa):
    """Shifts of 33..62, the converter's: on x86's vector paths the epilogue's int32-lane form (hi32: zx
    folded into the column correction, the rounding and zero point added to the product's high dword), with
    multipliers at +-2**31, |zx| up to 2**30, zero points and clip ranges at the output type's extremes, per
    tensor and per column, with a table; cases past its bounds (|zx| + K * 255**2 near 2**31, a zero point
    times 2**(c - 32) past int32, qmin - zy past int32, a shift of 32) take the 64-bit form. Both equal the
    reference, and each is taken."""
    need(isa)
    rng = np.random.default_rng(ISAS[isa] + 70)
    took = []
    for adt in (np.int8, np.uint8):
        for out in (np.int8, np.uint8, np.int16, np.int32):
            o = np.iinfo(out)
            for per_column in (False, True):
                for k, past in ((1, None), (64, "zx"), (257, "zy"), (1024, "shift"), (19, None)):
                    c = case(rng, adt, k, 37, 21, per_column, out=out)
                    size = c["shift"].size
                    c["shift"] = rng.integers(33, 63, size).astype(np.int64)
                    mults = [-(1 << 31), (1 << 31) - 1, 1 << 30, -12345, 3]
                    c["mult"] = rng.choice(mults, size).astype(np.int64)
                    c["zx"] = rng.integers(-(1 << 30), 1 << 30, size).astype(np.int32)
                    c["zy"] = out(rng.choice([o.min, o.max, 0]) if out != np.int32 else rng.integers(-3, 1))
                    if past == "zx":
                        c["zx"][-1] = (1 << 31) - 1 - k * 65025 // 2
                    elif past == "zy" and out != np.int32:
                        c["shift"][-1], c["zy"] = 62, out(o.max)
                    elif past == "shift":
                        c["shift"][-1] = 32
                    if out == np.int32 and past == "zy":
                        c["zy"] = out(7)  # qmin - zy below int32
                    want = reference(**c)
                    for threads in (1, 3):
                        got = run_c(isa, c, threads, forms=took)
                        np.testing.assert_array_equal(got, want, err_msg=f"{isa} K={k} {out.__name__} {past}")
                    if out in (np.int8, np.uint8):
                        tab = rng.integers(-(1 << 15), 1 << 15, c["qmax"] - c["qmin"] + 1).astype(np.int16)
                        got = run_c(isa, c, table=tab, forms=took)
                        np.testing.assert_array_equal(got, tab[want.astype(np.int64) - c["qmin"]])
    hi32 = [f & 1 for f in took]
    if isa in ("avx2", "vnni", "amx"):
        assert 0 < sum(hi32) < len(hi32), hi32
    else:
        assert sum(hi32) == 0


@pytest.mark.parametrize("isa", ISAS)
def test_byte_outputs_across_tiles(isa):
    """Byte outputs of the hi32 form without a residual stage, which the VNNI and AMX paths narrow a row's
    48 columns at a time (saturating packs, one lookup, one store): N across whole and partial 48-column tiles
    and 16-column vectors, int8 and uint8 outputs with clip ranges inside and at the type's bounds, weight
    zero points zero and not, with byte and int16 tables, 1 and 3 threads."""
    need(isa)
    rng = np.random.default_rng(ISAS[isa] + 90)
    took = []
    for n in (1, 16, 47, 48, 49, 96, 100, 197):
        for out in (np.int8, np.uint8):
            o = np.iinfo(out)
            c = case(rng, np.uint8 if n % 2 else np.int8, 64 + n % 5, n, 9 + n % 23, n % 3 == 0, out=out,
                     extremes=False)
            size = c["shift"].size
            if n % 4 == 0:
                c["zb"][:] = 0
                c["qmin"], c["qmax"] = int(o.min), int(o.max)
            # a converter's scales: the accumulators' spread over most of the clip range, centred by zx
            acc = (c["a"].astype(np.int64) - c["za"]) @ (c["b"].astype(np.int64) - c["zb"])
            axis = 0 if size > 1 else None
            c["zx"] = np.median(acc, axis=axis).reshape(-1).astype(np.int32)
            c["shift"] = rng.integers(33, 37, size).astype(np.int64)
            spread = acc.std(axis=axis).reshape(-1) + 1
            c["mult"] = np.clip(2.0 ** c["shift"] * 40 / spread, 1, 2**31 - 1).astype(np.int64)
            c["mult"] *= rng.choice([-1, 1], size)
            want = reference(**c)
            assert want.min() < want.max(), "a case that clips everything to one value"
            for threads in (1, 3):
                got = run_c(isa, c, threads, forms=took)
                np.testing.assert_array_equal(got, want, err_msg=f"{isa} N={n}")
            for tdt in (np.uint8, np.int8, np.int16):
                info = np.iinfo(tdt)
                table = rng.integers(info.min, info.max + 1, c["qmax"] - c["qmin"] + 1).astype(tdt)
                np.testing.assert_array_equal(run_c(isa, c, table=table, forms=took),
                                              reference(**c, table=table), err_msg=f"{isa} N={n} {tdt}")
    if isa in ("avx2", "vnni", "amx"):
        assert all(f & 1 for f in took), took
    if isa in ("vnni", "amx"):  # per case the two runs without a table and, with VBMI, the two byte tables
        vbmi = "avx512vbmi" in cpu.flags()
        assert sum(bool(f & 8) for f in took) == len(took) // 5 * (4 if vbmi else 2), took


@pytest.mark.parametrize("isa", ISAS)
def test_wide_multipliers(isa):
    """Multipliers past int32 (the vector paths' scalar epilogue), and qmin/qmax past int32 with int32 out."""
    need(isa)
    rng = np.random.default_rng(ISAS[isa] + 40)
    for adt in (np.int8, np.uint8):
        c = case(rng, adt, 64, 37, 20, True)
        c["mult"][3] = (1 << 40) + 3
        c["shift"][:] = 50
        np.testing.assert_array_equal(run_c(isa, c), reference(**c))
        c = case(rng, adt, 7, 19, 11, False, out=np.int32)
        c["qmin"], c["qmax"] = -(1 << 40), 1 << 40
        np.testing.assert_array_equal(run_c(isa, c), reference(**c))


@pytest.mark.parametrize("isa", ISAS)
def test_worst_case_accumulators(isa):
    """Every product at its largest, K = 1024: the raw int32 accumulator (b = 1, c = 0, int32 output)."""
    need(isa)
    for adt, av, za in ((np.uint8, 255, 0), (np.int8, -128, 127), (np.uint8, 0, 255), (np.int8, 127, -128)):
        for bv, zb in ((-128, 127), (127, -128), (-128, 0)):
            k, n = 1024, 19
            c = dict(a=np.full((3, k), av, adt), za=adt(za), b=np.full((k, n), bv, np.int8), zb=np.int8(zb),
                     zx=np.int32(-5), mult=np.int64(1), shift=np.int64(0), zy=np.int32(0),
                     qmin=-(1 << 31), qmax=(1 << 31) - 1)
            y = run_c(isa, c)
            assert int(y[0, 0]) == k * (av - za) * (bv - zb) + 5
            np.testing.assert_array_equal(y, reference(**c))


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("out", [np.uint8, np.int16, np.int32])
def test_output_types_and_table(isa, out):
    need(isa)
    rng = np.random.default_rng(ISAS[isa] * 7 + np.dtype(out).num)
    c = case(rng, np.uint8, 257, 45, 61, True, out=out)
    np.testing.assert_array_equal(run_c(isa, c), reference(**c))
    for tdt in (np.int16, np.int8, np.uint8):  # byte tables: vpermt2b lookups where the CPU has VBMI
        c = case(rng, np.int8 if tdt == np.int16 else np.uint8, 64, 51, 29, tdt == np.uint8)
        info = np.iinfo(tdt)
        table = rng.integers(info.min, info.max + 1, c["qmax"] - c["qmin"] + 1).astype(tdt)
        np.testing.assert_array_equal(run_c(isa, c, table=table), reference(**c, table=table))


def qgemm_model(c: dict, table=None, batch_shape=()) -> tuple[onnx.ModelProto, dict]:
    """A one-node QGemm (QGemmTable) model, everything but A an initializer."""
    k, n = c["b"].shape
    inits = [numpy_helper.from_array(np.asarray(c[key]), key)
             for key in ("za", "b", "zb", "zx", "mult", "shift", "zy")]
    names = ["a", "za", "b", "zb", "zx", "mult", "shift", "zy"]
    out_dt = np.asarray(c["zy"]).dtype
    if table is not None:
        inits.append(numpy_helper.from_array(table, "table"))
        names.append("table")
        out_dt = table.dtype
    a = c["a"].reshape(*batch_shape, -1, k)
    node = helper.make_node("QGemmTable" if table is not None else "QGemm", names, ["y"], domain=DOMAIN,
                            name="gemm", qmin=c["qmin"], qmax=c["qmax"])
    elem = helper.np_dtype_to_tensor_dtype
    graph = helper.make_graph([node], "qgemm", [helper.make_tensor_value_info("a", elem(a.dtype), a.shape)],
                              [helper.make_tensor_value_info("y", elem(np.dtype(out_dt)), None)], inits)
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid(DOMAIN, 1)]
    model = helper.make_model(graph, opset_imports=opsets, ir_version=10)
    return model, {"a": a}


def options() -> ort.SessionOptions:
    """Session options with the library registered for models without int8 x int8 GEMMs (QGemm's are its
    own), which registration accepts also where onnxruntime's int8 GEMM is inexact (Cortex-A72)."""
    opts = ort.SessionOptions()
    opts.add_session_config_entry(INT8_GEMMS, "0")
    opts.register_custom_ops_library(native_library())
    return opts


def ort_run(model: onnx.ModelProto, feeds: dict, threads: int = 1) -> np.ndarray:
    opts = options()
    opts.intra_op_num_threads = threads
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)[0]


@pytest.mark.parametrize("isa", ISAS)
def test_onnxruntime_op(isa, monkeypatch):
    """The custom op, with IVIT_GEMM_ISA forcing the path, on batched A, with and without the table."""
    need(isa)
    monkeypatch.setenv("IVIT_GEMM_ISA", isa)
    rng = np.random.default_rng(ISAS[isa])
    for adt, per_column in ((np.int8, True), (np.uint8, False)):
        c = case(rng, adt, 257, 37, 2 * 3 * 11, per_column)
        model, feeds = qgemm_model(c, batch_shape=(2, 3))
        want = reference(**c).reshape(2, 3, 11, 37)
        for threads in (1, 2):
            np.testing.assert_array_equal(ort_run(model, feeds, threads), want)
        table = rng.integers(-128, 128, c["qmax"] - c["qmin"] + 1).astype(np.int8)
        model, feeds = qgemm_model(c, table=table)
        np.testing.assert_array_equal(ort_run(model, feeds), reference(**c, table=table))


def test_refusals(monkeypatch):
    """A non-constant B, or a path this CPU or build cannot run, is refused naming the node."""
    rng = np.random.default_rng(3)
    c = case(rng, np.uint8, 7, 5, 3, False)
    model, feeds = qgemm_model(c)
    monkeypatch.setenv("IVIT_GEMM_ISA", "sse9")
    with pytest.raises(Exception, match="QGemm node 'gemm' refused: IVIT_GEMM_ISA must be"):
        ort_run(model, feeds)
    monkeypatch.delenv("IVIT_GEMM_ISA")
    model.graph.initializer.remove(next(t for t in model.graph.initializer if t.name == "b"))
    model.graph.input.append(helper.make_tensor_value_info("b", TensorProto.INT8, [7, 5]))
    with pytest.raises(Exception, match="QGemm node 'gemm' refused: input 2 must be a constant"):
        ort_run(model, {**feeds, "b": c["b"]})


#: the order in which AUTO takes the paths this CPU has (qgemm.cpp's pick)
PREFERENCE = ("amx", "vnni", "avx2", "i8mm", "dotprod", "neon", "portable")


def test_auto_takes_the_fastest_path(monkeypatch):
    """Without IVIT_GEMM_ISA a GEMM runs on the first path of PREFERENCE this CPU has (AMX over VNNI where the
    CPU and kernel allow the tiles), bit-exact."""
    monkeypatch.delenv("IVIT_GEMM_ISA", raising=False)
    best = next(p for p in PREFERENCE if _lib().ivit_qgemm_usable(ISAS[p]))
    c = case(np.random.default_rng(11), np.int8, 200, 50, 40, True)
    took = []
    np.testing.assert_array_equal(run_c("auto", c, threads=2, paths=took), reference(**c))
    assert took == [ISAS[best]]


def test_self_check_probes_every_path():
    """Registration probes each path at its worst cases and records the outcome; a refused path is never
    picked, and with no vector path left the compile step keeps MatMulInteger (``IVIT_GEMM_PROBE_FAULT=qgemm``
    refuses the vector paths; in a fresh process, as the probe runs once per process)."""
    from ivit_onnx.engines.onnxruntime.qgemm_fold import VECTOR_PATHS, fast_path

    outcome = options().get_session_config_entry("ivit.qgemm_check")
    vector = [isa for isa in ISAS if ISAS[isa] in VECTOR_PATHS and _lib().ivit_qgemm_supported(ISAS[isa])]
    for isa in ISAS:
        if _lib().ivit_qgemm_supported(ISAS[isa]):
            assert f"{isa} exact" in outcome
            assert _lib().ivit_qgemm_usable(ISAS[isa])
        else:
            assert f"{isa} " not in outcome and not _lib().ivit_qgemm_usable(ISAS[isa])
    assert fast_path() == bool(vector)
    code = (
        "import numpy as np\n"
        "from tests.opset.test_qgemm import case, qgemm_model, ort_run, reference, options\n"
        "from ivit_onnx.engines.onnxruntime.qgemm_fold import fast_path\n"
        "c = case(np.random.default_rng(1), np.int8, 257, 37, 20, True)\n"
        "model, feeds = qgemm_model(c)\n"
        "assert np.array_equal(ort_run(model, feeds), reference(**c))\n"
        "print(options().get_session_config_entry('ivit.qgemm_check'), '; fast path:', fast_path())\n"
    )
    env = {**os.environ, "IVIT_GEMM_PROBE_FAULT": "qgemm"}
    env.pop("IVIT_GEMM_ISA", None)
    out = subprocess.run([*PYTHON, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout
    assert "portable exact" in out and "; fast path: False" in out, out
    for isa in vector:
        assert f"{isa} refused (IVIT_GEMM_PROBE_FAULT)" in out


#: per path: the MACs one round of ivit_qgemm_peak does, and the products it sums (qgemm.cpp's peak loops)
PEAK = {"avx2": (6 * 16, 8 * 2 * -5 * (1 + 2 + 3 + 4 + 5 + 6)), "vnni": (12 * 64, 12 * 16 * 4 * 3 * -5),
        "neon": (12 * 4, 12 * 4 * 3 * -5), "dotprod": (12 * 16, 12 * 4 * 4 * 3 * -5),
        "i8mm": (12 * 32, 12 * 4 * 8 * 3 * -5)}


def _amx_peak_round() -> tuple[int, int]:
    """peak_amx's round: four 16 x 16 x 64 tdpbusd; tile 0 sums A (bytes i % 7 - 3 read as uint8) times B (the
    same bytes as int8, 16 groups of 4 k by 16 columns), and only tile 0 is summed."""
    src = (np.arange(16 * 64) % 7 - 3).astype(np.int8).reshape(16, 64)
    a = src.view(np.uint8).astype(np.int64)  # [m, k]
    b = src.astype(np.int64).reshape(16, 16, 4).transpose(0, 2, 1).reshape(64, 16)  # [k, n]: group g, byte i
    return 4 * 16 * 16 * 64, int((a @ b).sum())


PEAK["amx"] = _amx_peak_round()


@pytest.mark.parametrize("isa", ISAS)
def test_peak_loop_runs_its_instruction(isa):
    """The roofline's ceiling (bench_qgemm.py --kernel) really executes each round's products: the count it
    reports and the sum of its accumulators match the loop's instruction; the portable path has none."""
    need(isa)
    lib = _lib()
    lib.ivit_qgemm_peak.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.POINTER(ctypes.c_int32)]
    lib.ivit_qgemm_peak.restype = ctypes.c_int64
    total = ctypes.c_int32(0)
    macs = lib.ivit_qgemm_peak(ISAS[isa], 10, ctypes.byref(total))
    if isa == "portable":
        assert macs == 0
        return
    assert (macs, total.value) == (10 * PEAK[isa][0], np.int32(np.int64(10 * PEAK[isa][1])).item())
