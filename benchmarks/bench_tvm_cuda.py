"""TVM on CUDA: the integer DeiT vs its FP32 twin. Speed proxies always, timings and a kernel table on a GPU.

    python benchmarks/bench_tvm.py --target cuda [--models deit_tiny,deit_small] [--batch 8] [--arch sm_90]
                                   [--work DIR] [--iters 50] [--json OUT] [--kernels-out OUT.md]

For each model (random weights, built once under ``--work`` by ``bench_validate.build``) both graphs are
compiled for CUDA (the integer one with ivit-onnx's exact flags, the FP32 one with TVM's fast math) and
the proxies of :mod:`ivit_onnx.engines.tvm.proxies` are printed side by side: kernel launches per forward,
int8 tensor-core GEMMs of all GEMMs, GEMMs writing int32 to global memory, 64-bit integer div/rem in the
PTX (total and kernels holding any), thread blocks per GEMM launch (min, median: the grids of the
scheduled TIR, :func:`ivit_onnx.engines.tvm.cuda.record_launch_grids`), compile time (TVM, then nvcc to
PTX). Without a GPU it says so and exits 0 there. With one it also times TVM int, TVM FP32, torch FP32,
torch FP16 eager and FP16 ``torch.compile`` (the same ``models/`` definitions and weights), rounds
interleaved, medians and ratios;
checks the TVM integer output bit for bit against onnxruntime's run of the function bodies; and writes
the per-kernel GPU time of the TVM integer forward (``torch.profiler``, CUDA activities) to
``--kernels-out``. Exit status 1 if the integer output is not bit-exact.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import onnx

MODELS = ("deit_tiny", "deit_small")
PROXY_COLUMNS = (
    ("launches", "launches"),
    ("launch_calls", "launch calls"),
    ("gemms", "GEMMs"),
    ("int8_tc_gemms", "int8 TC GEMMs"),
    ("int32_gemm_outputs", "int32-out GEMMs"),
    ("div64_total", "div64"),
    ("div64_kernels", "div64 kernels"),
    ("kernels", "kernels"),
    ("gemm_blocks_min", "GEMM blocks min"),
    ("gemm_blocks_median", "GEMM blocks med"),
)


def _parse(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default=",".join(MODELS), help="comma-separated models/vit.py DeiT names")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--arch", default=None, help="sm_XX (default: the GPU's, else sm_90)")
    p.add_argument("--work", type=Path, default=Path("/tmp/ivit_bench_tvm_cuda"), help="ONNX files, reused")
    p.add_argument("--iters", type=int, default=50, help="timed rounds (GPU)")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--json", type=Path, default=None, help="write all results here")
    p.add_argument("--cuda-graph", action="store_true", help="both builds with relax.backend.use_cuda_graph")
    p.add_argument("--kernels-out", type=Path, default=None, help="per-kernel GPU time table (markdown)")
    return p.parse_args(argv)


def gpu_present() -> bool:
    import tvm

    return bool(tvm.cuda(0).exist)


def build_proxies(
    path: Path, arch: str, batch: int, exact: bool, cuda_graph: bool = False
) -> tuple[object, dict]:
    """Compile for cuda; the artifact and its proxy row plus compile seconds (TVM, nvcc) and div64 list."""
    from ivit_onnx.engines.tvm import compile_model
    from ivit_onnx.engines.tvm.cuda import cuda_sources, record_launch_grids, to_ptx
    from ivit_onnx.engines.tvm.proxies import measure
    from ivit_onnx.engines.tvm.tc_gemm import gemm_blocks

    t0 = time.perf_counter()
    with record_launch_grids() as grids:
        art = compile_model(
            path,
            target="cuda",
            arch=arch,
            shape={"input": [batch, 3, 224, 224]},
            fast_math=not exact,
            cuda_graph=cuda_graph,
        )
    tvm_s = time.perf_counter() - t0
    source = "\n".join(cuda_sources(art.module))
    t0 = time.perf_counter()
    ptx = to_ptx(source, arch, exact=exact)
    nvcc_s = time.perf_counter() - t0
    proxies = measure(art.module.as_text(), source, ptx)
    blocks = gemm_blocks(proxies.gemm_calls, grids)  # thread blocks per GEMM launch (scheduled TIR)
    row = {
        **proxies.row(),
        "gemm_blocks_min": min(blocks, default=0),
        "gemm_blocks_median": statistics.median(blocks) if blocks else 0,
        "gemm_blocks": blocks,
        "compile_s": tvm_s,
        "nvcc_s": nvcc_s,
        "div64_per_kernel": proxies.div64,
        "untraced_calls": proxies.untraced,
        "gemm_calls": proxies.gemm_calls,
    }
    return art, row


def print_proxies(rows: dict) -> None:
    head = f"{'model':<12}{'build':<6}" + "".join(f"{t:>17}" for _, t in PROXY_COLUMNS)
    print(head + f"{'TVM s':>9}{'nvcc s':>9}")
    for (model, build), row in rows.items():
        cells = "".join(f"{row[k]:>17}" for k, _ in PROXY_COLUMNS)
        print(f"{model:<12}{build:<6}{cells}{row['compile_s']:>9.1f}{row['nvcc_s']:>9.1f}")
    for (model, build), row in rows.items():
        if row["div64_per_kernel"]:
            per = ", ".join(
                f"{k[:48]}: {v}" for k, v in sorted(row["div64_per_kernel"].items(), key=lambda kv: -kv[1])
            )
            print(f"  {model} {build} 64-bit div/rem per kernel: {per}")
    for (model, build), row in rows.items():
        off = [
            f"{g[:40]}{'' if tc else ' (no int8 TC)'}{' (int32 out)' if i32 else ''}"
            for g, tc, i32 in row["gemm_calls"]
            if not tc or i32
        ]
        if build == "int" and off:
            print(f"  {model} int GEMMs off target: {'; '.join(sorted(set(off)))}")
    heads = ("TVM int", "TVM fp32", "nvcc int", "nvcc fp32", "total int/fp32")
    print(f"{'compile s':<18}" + "".join(f"{h:>{len(h) + 2}}" for h in heads))
    for model in dict.fromkeys(m for m, _ in rows):
        i, f = rows[(model, "int")], rows[(model, "fp32")]
        total = (i["compile_s"] + i["nvcc_s"]) / max(f["compile_s"] + f["nvcc_s"], 1e-9)
        print(
            f"{model:<18}{i['compile_s']:>9.1f}{f['compile_s']:>10.1f}{i['nvcc_s']:>10.1f}{f['nvcc_s']:>11.1f}"
            f"{total:>15.2f}x"
        )
    for model in dict.fromkeys(m for m, _ in rows):
        i, f = rows[(model, "int")], rows[(model, "fp32")]
        print(
            f"  {model}: launches int/fp32 {i['launches']}/{f['launches']}; targets: launches <= fp32, all "
            f"GEMMs on int8 tensor cores, no int32 GEMM output, no per-element 64-bit division, compile "
            f"(TVM + nvcc) <= 2x fp32"
        )


def _torch_runners(name: str, batch: int) -> dict:
    """torch FP32, FP16 eager and FP16 torch.compile of the same models/ definition and seed."""
    import copy

    import torch

    from ivit_onnx.models import vit

    torch.manual_seed(0)  # bench_validate.build's seed: the same weights as the ONNX files
    model = getattr(vit, f"{name}_patch16_224")().eval().cuda()
    half = copy.deepcopy(model).half()
    compiled = torch.compile(half)
    x32 = torch.randn(batch, 3, 224, 224, device="cuda")
    x16 = x32.half()

    def timed(fn, x):
        def call():
            with torch.inference_mode():
                fn(x)
            torch.cuda.synchronize()

        return call

    return {
        "torch fp32": timed(model, x32),
        "torch fp16": timed(half, x16),
        "torch fp16 compile": timed(compiled, x16),
    }


def _tvm_runner(art, feeds: dict):
    import tvm
    from tvm import relax

    dev = tvm.cuda(0)
    vm = relax.VirtualMachine(art.module, dev)
    args = [tvm.runtime.tensor(feeds[i["name"]], dev) for i in art.inputs]
    fn = vm["main"]

    def call():
        fn(*args)
        dev.sync()

    return call


def _bit_exact(art, int_path: Path, feeds: dict) -> bool:
    import onnxruntime as ort

    from ivit_onnx.opset.functions import attach_functions

    model = attach_functions(onnx.load(str(int_path)))
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return all(np.array_equal(a, b) for a, b in zip(art.run(feeds), sess.run(None, feeds), strict=True))


def kernel_table(fn, rounds: int = 20) -> list[tuple[str, int, float]]:
    """(kernel, calls per forward, GPU µs per forward) of ``fn`` under torch.profiler, slowest first."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(rounds):
            fn()
    rows = []
    for evt in prof.key_averages():
        device_us = getattr(evt, "self_device_time_total", None)
        device_us = evt.self_cuda_time_total if device_us is None else device_us
        if getattr(evt, "device_type", None) == torch.autograd.DeviceType.CUDA and device_us > 0:
            rows.append((evt.key, evt.count // rounds, device_us / rounds))
    return sorted(rows, key=lambda r: -r[2])


def time_on_gpu(name: str, paths: dict, arts: dict, args) -> tuple[dict, bool, list]:
    """Interleaved medians (ms) of the five runners, the bit-exact check and the kernel table."""
    import torch
    from bench_tvm import measure

    rng = np.random.default_rng(0)
    feeds = {"input": rng.standard_normal((args.batch, 3, 224, 224)).astype(np.float32)}
    exact = _bit_exact(arts["int"], paths["int"], feeds)
    runners = {"tvm int": _tvm_runner(arts["int"], feeds), "tvm fp32": _tvm_runner(arts["fp32"], feeds)}
    if torch.cuda.is_available():
        runners.update(_torch_runners(name, args.batch))
    else:
        print("  torch has no CUDA here: torch runners skipped")
    times = measure(runners, args.iters, args.warmup)
    return (
        {k: statistics.median(v) * 1e3 for k, v in times.items()},
        exact,
        _kernels_or_note(runners["tvm int"]),
    )


def _kernels_or_note(fn) -> list:
    """The kernel table, or (when this torch's profiler API differs) an empty one and a note."""
    try:
        return kernel_table(fn)
    except Exception as exc:  # noqa: BLE001 - timings and exactness are still worth printing
        print(f"  per-kernel table unavailable: {type(exc).__name__}: {exc}")
        return []


def main(argv=None) -> int:
    args = _parse(argv)
    sys.path.insert(0, str(Path(__file__).parent))
    from bench_validate import build

    gpu = gpu_present()
    if args.arch is None:
        import tvm

        args.arch = ("sm_" + tvm.cuda(0).compute_version.replace(".", "")) if gpu else "sm_90"
    args.work.mkdir(parents=True, exist_ok=True)
    names = [n.strip() for n in args.models.split(",") if n.strip()]
    rows, results, ok = {}, {"batch": args.batch, "arch": args.arch, "gpu": gpu, "models": {}}, True
    print(f"CUDA proxies, batch {args.batch}, {args.arch} (integer build: exact flags; FP32: TVM fast math)")
    t0 = time.perf_counter()
    import tvm.s_tir.tensor_intrin.cuda  # noqa: F401 - TVM parses ~250 TVMScript intrinsics on first use

    results["intrin_import_s"] = time.perf_counter() - t0
    print(
        f"one-time TVM tensor-intrinsic import (paid by the first int8 CUDA build of a process, not in "
        f"'TVM s' below): {results['intrin_import_s']:.1f} s"
    )
    arts_by_model = {}
    for name in names:
        paths = build(args.work, name)
        arts = {}
        for build_name, exact in (("int", True), ("fp32", False)):
            arts[build_name], rows[(name, build_name)] = build_proxies(
                paths[build_name], args.arch, args.batch, exact, args.cuda_graph
            )
        arts_by_model[name] = (paths, arts)
        results["models"][name] = {"proxies": {b: rows[(name, b)] for b in ("int", "fp32")}}
    print_proxies(rows)
    if not gpu:
        print("no GPU here (tvm.cuda(0) does not exist): proxies only; timings need a GPU machine")
    else:
        tables = []
        for name, (paths, arts) in arts_by_model.items():
            med, exact, kernels = time_on_gpu(name, paths, arts, args)
            ok &= exact
            base = med.get("torch fp16 compile")
            print(f"{name}, batch {args.batch}: TVM int == onnxruntime bit-exact: {exact}")
            print(f"  {'runner':<20}{'median ms':>11}{'vs torch fp16 compile':>23}")
            for k, v in med.items():
                ratio = f"{v / base:>22.2f}x" if base else f"{'-':>23}"
                print(f"  {k:<20}{v:>11.3f}{ratio}")
            print(
                f"  tvm int / tvm fp32: {med['tvm int'] / med['tvm fp32']:.2f}x (goal for int / torch fp16 "
                f"compile: <= 0.6)"
            )
            results["models"][name].update({"median_ms": med, "bit_exact": exact, "kernels": kernels})
            tables.append(
                f"### {name}, batch {args.batch}: TVM integer forward, GPU time per kernel\n\n"
                "| kernel | calls | µs per forward |\n|---|---|---|\n"
                + "".join(f"| {k[:80]} | {c} | {us:.1f} |\n" for k, c, us in kernels)
            )
        if args.kernels_out:
            args.kernels_out.write_text("\n".join(tables))
            print(f"wrote {args.kernels_out}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, default=str) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
