"""The library's own GEMM (QGemm, ``opset/native/qgemm.cpp``): the bare kernel's int8 MAC/s per
instruction-set path, and the onnxruntime engine with and without it on DeiT models.

    python benchmarks/bench_qgemm.py [--kernel] [--model deit_tiny,deit_small] [--batch 8] [--threads 2]
                                     [--iters 10] [--out DIR]

``--kernel``: each path this CPU has (portable, AVX2 ``vpmaddwd``, AVX-512 VNNI ``vpdpbusd``, aarch64 NEON
``smlal``, ``sdot``, i8mm ``smmla``) on DeiT's GEMM shapes (rows = batch * 197 tokens), one thread, through
the C entry points: GMAC/s (the epilogue included), with onnxruntime's MatMulInteger (uint8 x int8, one
thread, int32 out, no Requantize) on the same shape for scale, and a last line with each path's peak: its
multiply-accumulate instruction alone, on registers (the roofline's ceiling on this CPU). ``--model``: the
engine's session on ``int.onnx`` (built as ``bench_validate.py`` builds it) with the compile step's QGemm
fusion on, on without attention's QBatchMatMul, and off, interleaved with onnxruntime FP32; all must give the
same bits.
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.util
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper

from ivit_onnx import bench
from ivit_onnx.engines.onnxruntime import InferenceSession
from ivit_onnx.engines.onnxruntime.qgemm_fold import GEMM_PATHS
from ivit_onnx.engines.onnxruntime.session import session_options
from ivit_onnx.opset import native_kernels

ISAS = GEMM_PATHS
#: (K, N) of a DeiT block's GEMMs: qkv, proj, fc1, fc2
SHAPES = {"deit_tiny": [(192, 576), (192, 192), (192, 768), (768, 192)],
          "deit_small": [(384, 1152), (384, 384), (384, 1536), (1536, 384)]}


def _lib():
    lib = native_kernels._LIB
    p, i, c = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    lib.ivit_qgemm_supported.argtypes, lib.ivit_qgemm_supported.restype = [c], c
    lib.ivit_qgemm_create.argtypes = [c, c, i, i, p, p, i, i, p, p, p, i, i, i, i, p, c,
                                      ctypes.POINTER(ctypes.c_char_p)]
    lib.ivit_qgemm_create.restype = p
    lib.ivit_qgemm_run.argtypes, lib.ivit_qgemm_run.restype = [p, p, i, p, c], c
    lib.ivit_qgemm_destroy.argtypes = [p]
    lib.ivit_qgemm_peak.argtypes, lib.ivit_qgemm_peak.restype = [c, i, ctypes.POINTER(ctypes.c_int32)], i
    return lib


def peak(lib, path: str, reps: int = 5) -> float | None:
    """GMAC/s of the path's bare multiply-accumulate instruction (12 chains on registers, one thread): the
    roofline's ceiling on this CPU, or None (portable)."""
    sink = ctypes.c_int32(0)
    iters = 2_000_000
    if not lib.ivit_qgemm_peak(ISAS[path], 1000, ctypes.byref(sink)):
        return None
    run = lambda: lib.ivit_qgemm_peak(ISAS[path], iters, ctypes.byref(sink))  # noqa: E731
    best = min(_timed(run) for _ in range(reps))
    return lib.ivit_qgemm_peak(ISAS[path], 1, ctypes.byref(sink)) * iters / best / 1e9


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def best_of(fn, reps: int) -> float:
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def ort_matmul_integer(a: np.ndarray, w: np.ndarray):
    """onnxruntime's MatMulInteger (uint8 x constant int8), one thread: a callable running it."""
    node = helper.make_node("MatMulInteger", ["a", "w"], ["y"])
    g = helper.make_graph([node], "mm", [helper.make_tensor_value_info("a", onnx.TensorProto.UINT8, a.shape)],
                          [helper.make_tensor_value_info("y", onnx.TensorProto.INT32, None)],
                          [numpy_helper.from_array(w, "w")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return lambda: sess.run(None, {"a": a})


def kernel(models: list[str], batch: int, reps: int = 20) -> None:
    lib = _lib()
    rng = np.random.default_rng(0)
    rows = batch * 197
    print(f"bare kernel, one thread, M = {rows} rows (batch {batch} x 197 tokens); GMAC/s, best of {reps}")
    paths = [p for p in ISAS if lib.ivit_qgemm_supported(ISAS[p])]
    print(f"{'model':<12}{'K':>6}{'N':>6}" + "".join(f"{p:>10}" for p in paths) + f"{'ort MMI':>10}")
    for name in models:
        for k, n in SHAPES[name]:
            a = rng.integers(0, 256, (rows, k)).astype(np.uint8)
            w = rng.integers(-128, 128, (k, n)).astype(np.int8)
            zb = np.zeros(1, np.int64)
            zx = np.array([-7], np.int64)
            # a DeiT attention Requantize's (b, c): 2**30 <= b < 2**31, c = 38
            mult, shift = np.array([1135961291], np.int64), np.array([38], np.int64)
            y = np.empty((rows, n), np.int8)
            cells = []
            for p in paths:
                err = ctypes.c_char_p()
                g = lib.ivit_qgemm_create(ISAS[p], 1, k, n, w.ctypes.data, zb.ctypes.data, 1, 128,
                                          zx.ctypes.data, mult.ctypes.data, shift.ctypes.data, 1, 0,
                                          -128, 127, None, 0, ctypes.byref(err))
                assert g, err.value
                pa, py = a.ctypes.data, y.ctypes.data
                s = best_of(lambda g=g, pa=pa, py=py: lib.ivit_qgemm_run(g, pa, rows, py, 1), reps)
                lib.ivit_qgemm_destroy(g)
                cells.append(rows * k * n / s / 1e9)
            cells.append(rows * k * n / best_of(ort_matmul_integer(a, w), reps) / 1e9)
            print(f"{name:<12}{k:>6}{n:>6}" + "".join(f"{c:>10.1f}" for c in cells))
    ceilings = [peak(lib, p) for p in paths]
    print(f"{'peak':<24}" + "".join(f"{c:>10.1f}" if c else f"{'-':>10}" for c in ceilings)
          + f"{'':>10}  (the path's MAC instruction alone on registers: the roofline's ceiling)")


def _bench_validate():
    path = Path(__file__).resolve().parent / "bench_validate.py"
    spec = importlib.util.spec_from_file_location("bench_validate", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def model(name: str, out: Path, batch: int, threads: int, iters: int) -> bool:
    paths = _bench_validate().build(out, name)
    feeds = {"input": np.random.default_rng(0).standard_normal((batch, 3, 224, 224)).astype(np.float32)}
    integer = onnx.load(paths["int"])
    # no idle spinning anywhere: a spinning pool would steal the cores of the candidate timed after it
    cpu = ["CPUExecutionProvider"]
    fp32 = ort.InferenceSession(str(paths["fp32"]), session_options(threads), providers=cpu)
    on = InferenceSession(integer, threads=threads)
    off = InferenceSession(integer, threads=threads, qgemm=False)
    no_attn = InferenceSession(integer, threads=threads, qbatch=False)
    cands = {"fp32 (onnxruntime)": lambda: fp32.run(None, feeds),
             "int: library, QGemm": lambda: on.run(None, feeds),
             "int: library, QGemm, no QBatchMatMul": lambda: no_attn.run(None, feeds),
             "int: library, no QGemm": lambda: off.run(None, feeds)}
    report = bench.bench(cands, batch=batch, iters=iters, baseline="fp32 (onnxruntime)", threads=threads,
                         title=f"\n{name} 224², batch {batch}, {threads} threads")
    print(report.text(device=False))
    print(f"QGemm: {on.describe()}")
    ref = off.run(None, feeds)
    same = bench.same_bits(on.run(None, feeds), ref) and bench.same_bits(no_attn.run(None, feeds), ref)
    print(f"exact: QGemm == QGemm without QBatchMatMul == no QGemm: {'yes' if same else 'no'}")
    return same


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernel", action="store_true", help="time the bare kernel per path")
    ap.add_argument("--model", default="", help="comma list of deit_tiny, deit_small (engine on/off)")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--out", default=str(Path(tempfile.gettempdir()) / "ivit_bench_validate"))
    args = ap.parse_args(argv)
    models = [m for m in args.model.split(",") if m]
    print(bench.device_line(bench.device(args.threads)))
    if args.kernel:
        kernel(models or ["deit_tiny"], args.batch)
    ok = True
    for name in models:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        ok = model(name, out, args.batch, args.threads, args.iters) and ok
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
