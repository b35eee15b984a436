"""TVM (llvm) on the integer model vs TVM on its FP32 twin vs onnxruntime FP32, measured side by side.

    python benchmarks/bench_tvm.py --target cuda ...   # CUDA proxies, GPU timings (bench_tvm_cuda.py)

    python benchmarks/bench_tvm.py INT.onnx FP32.onnx [--trials 0] [--tune-dir DIR] [--batch 8]
                                   [--threads 2] [--iters 20] [--json OUT]
    python benchmarks/bench_tvm.py --demo [--batch 8] ...    # a hand-built DeiT-Tiny-sized block pair
    python benchmarks/bench_tvm.py INT.onnx FP32.onnx --compile-only   # compile times only, int vs fp32

Both models are compiled for the host CPU with the same meta-schedule budget (``--trials`` each, separate
databases under ``--tune-dir`` so reruns reuse them). With 0 trials, every GEMM of both builds still has a
deterministic schedule (``engines/tvm/cpu_gemm.py``: int8 on AVX-512 VNNI where the CPU has it, else AVX2
``vpmaddwd`` (``IVIT_TVM_VNNI=0`` forces it), FP32 on packed FMA tiles; tuning skips those) and FP32
softmax/LayerNorm dlight's CPU rule. onnxruntime runs the FP32 model and, for reference, the integer model
through its function bodies. Every runner gets the same random inputs and runs once per round, rounds
interleaved, so all are measured under the same load; the median per batch is reported with ratios, the CPU
model and the load average. The TVM integer output is
checked bit for bit against onnxruntime's run of the function bodies (freshly attached, as the TVM path
does: bodies stored in an older file may predate the current opset).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx


def _parse(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("int_model", nargs="?", help="integer model (ai.ivit ops with function bodies)")
    p.add_argument("fp32_model", nargs="?", help="its FP32 twin")
    p.add_argument("--demo", action="store_true", help="benchmark a hand-built integer/FP32 block pair")
    p.add_argument("--trials", type=int, default=0, help="meta-schedule trials per model (0: untuned)")
    p.add_argument("--tune-dir", type=Path, default=None, help="tuning databases (default: a temp dir)")
    p.add_argument("--batch", type=int, default=8, help="value for a dynamic first input dimension")
    p.add_argument("--threads", type=int, default=os.cpu_count(), help="threads for TVM and onnxruntime")
    p.add_argument("--iters", type=int, default=20, help="timed rounds")
    p.add_argument("--warmup", type=int, default=2, help="untimed rounds")
    p.add_argument("--json", type=Path, default=None, help="write the results here")
    p.add_argument("--compile-only", action="store_true", help="compile both, print the times, run nothing")
    p.add_argument("--no-ort-int", action="store_true",
                   help="check onnxruntime's integer run once for exactness but do not time it (slow)")
    args = p.parse_args(argv)
    if not args.demo and not (args.int_model and args.fp32_model):
        p.error("give INT and FP32 model paths, or --demo")
    return args


def demo_models(out: Path, batch: int, tokens: int = 197, dim: int = 192,
                hidden: int = 768) -> tuple[Path, Path]:
    """A DeiT-Tiny-sized MLP + attention-score block, integer (all five private ops) and FP32."""
    from onnx import TensorProto, helper, numpy_helper

    from ivit_onnx.opset import OPS
    from ivit_onnx.opset.functions import attach_functions

    rng = np.random.default_rng(0)
    w1, w2 = (rng.integers(-127, 128, s).astype(np.int8) for s in ((dim, hidden), (hidden, dim)))
    i64 = np.int64
    c = {"w1": w1, "w2": w2, "x_zp": np.uint8(128),
         "b1": rng.integers(-2**12, 2**12, hidden).astype(np.int32),
         "b2": rng.integers(-2**12, 2**12, dim).astype(np.int32), "zp32": np.int32(0), "zp8": np.int8(0),
         "zpu8": np.uint8(0), "m1": np.full(hidden, 1 << 20, i64), "c1": np.full(hidden, 28, i64),
         "m2": np.full(dim, 1 << 20, i64), "c2": np.full(dim, 29, i64), "gm": i64(1 << 18), "gc": i64(26),
         "am": i64(3 << 28), "bm": i64(5 << 27), "abc": i64(31), "lnm": np.full(dim, 1 << 20, i64),
         "lnc": np.full(dim, 36, i64), "lnb": np.zeros(dim, i64), "pm": i64(1 << 20), "pc": i64(28)}
    q = {"qmin": -128, "qmax": 127}
    nodes = [
        helper.make_node("MatMulInteger", ["x", "w1", "x_zp"], ["a1"]),
        helper.make_node("Add", ["a1", "b1"], ["a1b"]),
        OPS["Requantize"].make_node(["a1b", "zp32", "m1", "c1", "zp8"], ["h1"], **q),
        OPS["ShiftGELU"].make_node(["h1", "gm", "gc", "zp8"], ["g"], x0=30, n=20, bits=8, **q),
        helper.make_node("MatMulInteger", ["g", "w2"], ["a2"]),
        helper.make_node("Add", ["a2", "b2"], ["a2b"]),
        OPS["Requantize"].make_node(["a2b", "zp32", "m2", "c2", "zp8"], ["h2"], **q),
        OPS["IAdd"].make_node(["h2", "x", "zp8", "x_zp", "am", "bm", "abc", "zp8"], ["r"], **q),
        OPS["ILayerNorm"].make_node(["r", "lnm", "lnc", "lnb", "zp8"], ["n"], shift_in=0, p=24, **q),
        helper.make_node("Transpose", ["n"], ["nt"], perm=[0, 2, 1]),
        helper.make_node("MatMulInteger", ["n", "nt"], ["s"]),
        OPS["Shiftmax"].make_node(["s", "zpu8"], ["prob"], x0=2**14, n=20, bits=8),
        helper.make_node("MatMulInteger", ["prob", "n", "zpu8", "zp8"], ["o"]),
        OPS["Requantize"].make_node(["o", "zp32", "pm", "pc", "zp8"], ["y"], **q),
    ]
    shape = [batch, tokens, dim]
    g = helper.make_graph(nodes, "demo_int", [helper.make_tensor_value_info("x", TensorProto.UINT8, shape)],
                          [helper.make_tensor_value_info("y", TensorProto.INT8, shape)],
                          initializer=[numpy_helper.from_array(np.asarray(v), k) for k, v in c.items()])
    int_model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    attach_functions(int_model)

    f = {"w1": (w1 / 127).astype(np.float32), "w2": (w2 / 127).astype(np.float32),
         "b1": np.zeros(hidden, np.float32), "b2": np.zeros(dim, np.float32), "half": np.float32(0.5),
         "one": np.float32(1), "rsqrt2": np.float32(2**-0.5), "gamma": np.ones(dim, np.float32),
         "beta": np.zeros(dim, np.float32)}
    fnodes = [
        helper.make_node("MatMul", ["x", "w1"], ["a1"]), helper.make_node("Add", ["a1", "b1"], ["h1"]),
        helper.make_node("Mul", ["h1", "rsqrt2"], ["t"]), helper.make_node("Erf", ["t"], ["e"]),
        helper.make_node("Add", ["e", "one"], ["e1"]), helper.make_node("Mul", ["h1", "half"], ["hh"]),
        helper.make_node("Mul", ["hh", "e1"], ["g"]),
        helper.make_node("MatMul", ["g", "w2"], ["a2"]), helper.make_node("Add", ["a2", "b2"], ["h2"]),
        helper.make_node("Add", ["h2", "x"], ["r"]),
        helper.make_node("LayerNormalization", ["r", "gamma", "beta"], ["n"], axis=-1),
        helper.make_node("Transpose", ["n"], ["nt"], perm=[0, 2, 1]),
        helper.make_node("MatMul", ["n", "nt"], ["s"]), helper.make_node("Softmax", ["s"], ["prob"], axis=-1),
        helper.make_node("MatMul", ["prob", "n"], ["y"]),
    ]
    fx = helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)
    fg = helper.make_graph(fnodes, "demo_fp32", [fx],
                           [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
                           initializer=[numpy_helper.from_array(np.asarray(v), k) for k, v in f.items()])
    fp32_model = helper.make_model(fg, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    paths = out / "demo_int.onnx", out / "demo_fp32.onnx"
    onnx.save(int_model, paths[0])
    onnx.save(fp32_model, paths[1])
    return paths


def input_specs(model: onnx.ModelProto, batch: int) -> dict[str, tuple[list[int], np.dtype]]:
    """Graph inputs with the dynamic dimensions (the batch) fixed to ``batch``."""
    inits = {i.name for i in model.graph.initializer}
    specs = {}
    for vi in model.graph.input:
        if vi.name not in inits:
            dims = [d.dim_value if d.HasField("dim_value") else batch for d in vi.type.tensor_type.shape.dim]
            specs[vi.name] = (dims, onnx.helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type))
    return specs


def random_inputs(specs, rng) -> dict[str, np.ndarray]:
    out = {}
    for name, (shape, dt) in specs.items():
        if np.issubdtype(dt, np.integer):
            info = np.iinfo(dt)
            out[name] = rng.integers(info.min, info.max, shape, endpoint=True).astype(dt)
        else:
            out[name] = rng.standard_normal(shape).astype(dt)
    return out


#: the 8-bit dot products of the int build: VNNI; AVX2 (LLVM fuses it with its add into vpdpwssd on VNNI CPUs)
DOT_INSTRUCTIONS = ("vpdpbusd", "vpmaddwd", "vpdpwssd")


def _tvm_runner(path: Path, specs, feeds, trials: int, tune_dir: Path):
    """Compile for the host CPU; returns (timed call, call returning numpy outputs, compile seconds, the
    count of each 8-bit dot-product instruction in the build)."""
    import tvm
    from tvm import relax

    from ivit_onnx.engines.tvm import compile_model

    t0 = time.perf_counter()
    reuse = (tune_dir / "database_workload.json").exists()
    art = compile_model(path, shape={k: v[0] for k, v in specs.items()}, tune_trials=trials,
                        tune_db=tune_dir if trials or reuse else None)
    seconds = time.perf_counter() - t0
    vm = relax.VirtualMachine(art.module, tvm.cpu())
    args = [tvm.runtime.tensor(feeds[i["name"]]) for i in art.inputs]
    fn = vm["main"]
    from ivit_onnx.engines.tvm.cpu_gemm import llvm_asm

    asm = llvm_asm(art.module)
    dots = {ins: asm.count(ins) for ins in DOT_INSTRUCTIONS}
    return (lambda: fn(*args)), (lambda: art.run([feeds[i["name"]] for i in art.inputs])), seconds, dots


def _ort_runner(model_or_path, feeds, threads: int):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")  # no spinning into the next runner
    is_proto = isinstance(model_or_path, onnx.ModelProto)
    data = model_or_path.SerializeToString() if is_proto else str(model_or_path)
    sess = ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])
    return lambda: sess.run(None, feeds)


def cpu_model() -> str:
    """The host CPU's model name (``/proc/cpuinfo``), for the record next to a figure."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def measure(runners: dict, iters: int, warmup: int) -> dict[str, list[float]]:
    """Seconds per call of each runner, one call per runner per round, rounds interleaved."""
    times = {k: [] for k in runners}
    for r in range(warmup + iters):
        for name, fn in runners.items():
            t0 = time.perf_counter()
            fn()
            if r >= warmup:
                times[name].append(time.perf_counter() - t0)
    return times


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    target = argparse.ArgumentParser(add_help=False)
    target.add_argument("--target", choices=("llvm", "cuda"), default="llvm")
    known, rest = target.parse_known_args(argv)
    if known.target == "cuda":
        sys.path.insert(0, str(Path(__file__).parent))
        from bench_tvm_cuda import main as cuda_main

        return cuda_main(rest)
    args = _parse(rest)
    os.environ.setdefault("TVM_NUM_THREADS", str(args.threads))  # read when TVM's thread pool starts
    work = Path(tempfile.mkdtemp(prefix="ivit_bench_tvm_"))
    tune_dir = args.tune_dir or work / "tune"
    int_path, fp32_path = (demo_models(work, args.batch) if args.demo
                           else (Path(args.int_model), Path(args.fp32_model)))
    int_model, fp32_model = onnx.load(str(int_path)), onnx.load(str(fp32_path))
    rng = np.random.default_rng(0)
    int_specs, fp32_specs = input_specs(int_model, args.batch), input_specs(fp32_model, args.batch)
    fp32_feeds = random_inputs(fp32_specs, rng)
    int_feeds = {k: fp32_feeds[k] if k in fp32_feeds and fp32_specs[k] == v else random_inputs({k: v}, rng)[k]
                 for k, v in int_specs.items()}

    tvm_int, tvm_int_out, int_s, int_dots = _tvm_runner(int_path, int_specs, int_feeds, args.trials,
                                                        tune_dir / "int")
    tvm_fp32, _, fp32_s, _ = _tvm_runner(fp32_path, fp32_specs, fp32_feeds, args.trials, tune_dir / "fp32")
    compile_line = (
        f"compile (llvm, int first in this process): int {int_s:.1f} s, fp32 {fp32_s:.1f} s, "
        f"int/fp32 {int_s / fp32_s:.2f}x"
    )
    if args.compile_only:  # again, each, with the process warm: the first build also pays one-off costs
        again = [_tvm_runner(p, sp, fd, args.trials, tune_dir / k)[2] for p, sp, fd, k in
                 ((int_path, int_specs, int_feeds, "int"), (fp32_path, fp32_specs, fp32_feeds, "fp32"))]
        print(f"batch {args.batch}, {args.trials} trials per model; {compile_line}; warm: "
              f"int {again[0]:.1f} s, fp32 {again[1]:.1f} s, int/fp32 {again[0] / again[1]:.2f}x")
        return 0
    ort_fp32 = _ort_runner(fp32_path, fp32_feeds, args.threads)
    from ivit_onnx.opset.functions import attach_functions

    # stock onnxruntime runs the function bodies; fresh ones, as prepare_for_tvm uses (a file's may be stale)
    ort_int = _ort_runner(attach_functions(int_model), int_feeds, args.threads)
    exact = all(np.array_equal(a, b) for a, b in zip(tvm_int_out(), ort_int(), strict=True))

    runners = {"tvm int": tvm_int, "tvm fp32": tvm_fp32, "ort fp32": ort_fp32, "ort int (bodies)": ort_int}
    if args.no_ort_int:
        del runners["ort int (bodies)"]
    load_before = os.getloadavg()[0]
    times = measure(runners, args.iters, args.warmup)
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    tuning = f"{args.trials} new trials per model" + (" + stored database" if args.tune_dir else "")
    print(f"batch {args.batch}, {args.threads} threads, {tuning}, {args.iters} rounds; "
          f"{compile_line}; TVM int == ORT int bit-exact: {exact}")
    print(f"{'runner':<18}{'median ms':>11}{'p10':>9}{'p90':>9}{'vs ort fp32':>13}")
    for name, v in times.items():
        q = statistics.quantiles([x * 1e3 for x in v], n=10) if len(v) > 1 else [med[name]] * 9
        print(f"{name:<18}{med[name]:>11.2f}{q[0]:>9.2f}{q[-1]:>9.2f}{med[name] / med['ort fp32']:>12.2f}x")
    print(f"tvm int / tvm fp32: {med['tvm int'] / med['tvm fp32']:.2f}x; {cpu_model()}, "
          f"{os.cpu_count()} CPUs, "
          f"1-min load {load_before:.2f} before / {os.getloadavg()[0]:.2f} after the timed rounds; "
          f"dot-product instructions in the int build: "
          f"{', '.join(f'{k} {v}' for k, v in int_dots.items())}")
    if args.json:
        result = {"batch": args.batch, "threads": args.threads, "trials": args.trials,
                  "compile_s": {"int": int_s, "fp32": fp32_s}, "bit_exact": exact, "median_ms": med,
                  "cpu": cpu_model(), **int_dots,
                  "models": [str(int_path), str(fp32_path)]}
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0 if exact else 1


if __name__ == "__main__":
    sys.exit(main())
