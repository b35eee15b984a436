"""CUDA: our tensor-core GEMM (``engines.tvm.tc_gemm``) on DeiT's GEMM shapes with the weights as ONNX stores
them ([K, N]) and pre-transposed ([N, K], K contiguous), each checked bit for bit against numpy and timed
(``time_evaluator``: the minimum of 5 x 50 launches). Needs a CUDA device.

    python benchmarks/bench_tc_layout.py [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import tvm
from tvm import te

from ivit_onnx.engines.tvm import cuda
from ivit_onnx.engines.tvm.compile import make_target
from ivit_onnx.engines.tvm.tc_gemm import schedule_tc_gemm

SHIFT = 9
#: name: (batch, M, K, N, dtype): DeiT-Tiny/Small batch 8 (and one batch-64 fc1); batch 0 is a 2-D GEMM
SHAPES = {
    "tiny_fc2": (0, 1576, 768, 192, "int8"),
    "tiny_fc1": (0, 1576, 192, 768, "int8"),
    "tiny_qkv": (0, 1576, 192, 576, "int8"),
    "small_fc1": (0, 1576, 384, 1536, "int8"),
    "small_fc2": (0, 1576, 1536, 384, "int8"),
    "b64_tiny_fc1": (0, 64 * 197, 192, 768, "int8"),
    "tiny_qk": (24, 197, 64, 197, "int8"),
    "tiny_pv_u8": (24, 197, 197, 64, "uint8"),
}


def gemm(batch: int, m: int, k: int, n: int, dtype: str, nk: bool):
    """``y = int8((a @ w) >> SHIFT)`` with ``w`` held as [K, N] or (``nk``) [N, K]."""
    lead = (batch,) if batch else ()
    a = te.placeholder((*lead, m, k), dtype, name="a")
    w = te.placeholder((*lead, n, k) if nk else (*lead, k, n), dtype, name="w")
    r = te.reduce_axis((0, k), name="k")

    def product(*idx):
        *s, i, j = idx
        wj = w[(*s, j, r)] if nk else w[(*s, r, j)]
        return te.sum(a[(*s, i, r)].astype("int32") * wj.astype("int32"), axis=r)

    acc = te.compute((*lead, m, n), product, name="gemm")
    y = te.compute((*lead, m, n), lambda *idx: (acc[idx] >> SHIFT).astype("int8"), name="narrow")
    return te.create_prim_func([a, w, y]).with_attr("global_symbol", "matmul")


def run(name: str, nk: bool, tgt, dev) -> dict:
    batch, m, k, n, dtype = SHAPES[name]
    mod = schedule_tc_gemm(gemm(batch, m, k, n, dtype, nk), dtype, tgt, cuda.register_u8_wmma()).mod
    executable = tvm.compile(mod, target=tgt)
    info, rng = np.iinfo(dtype), np.random.default_rng(0)
    lead = (batch,) if batch else ()
    a = rng.integers(info.min, info.max, (*lead, m, k), endpoint=True).astype(dtype)
    w = rng.integers(info.min, info.max, (*lead, k, n), endpoint=True).astype(dtype)
    expected = ((a.astype(np.int64) @ w.astype(np.int64)).astype(np.int32) >> SHIFT).astype(np.int8)
    held = np.ascontiguousarray(np.swapaxes(w, -1, -2)) if nk else w
    args = [tvm.runtime.tensor(x, dev) for x in (a, held, np.zeros_like(expected))]
    executable["matmul"](*args)
    exact = bool(np.array_equal(args[2].numpy(), expected))
    us = min(executable.mod.time_evaluator("matmul", dev, number=50, repeat=5)(*args).results) * 1e6
    return {"us": round(us, 2), "exact": exact, "tmac_s": round(max(batch, 1) * m * n * k / us / 1e6, 1)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", type=Path, default=None, help="write the results here")
    args = p.parse_args(argv)
    dev = tvm.cuda(0)
    if not dev.exist:
        print("bench_tc_layout: no CUDA device", file=sys.stderr)
        return 2
    major, minor = dev.compute_version.split(".")
    tgt = make_target("cuda", f"sm_{major}{minor}")
    results, start = {}, time.time()
    print(f"{'GEMM':<14}{'[K, N] us':>11}{'[N, K] us':>11}{'ratio':>8}  exact")
    for name in SHAPES:
        kn, nk = run(name, False, tgt, dev), run(name, True, tgt, dev)
        results[name] = {"kn": kn, "nk": nk}
        print(f"{name:<14}{kn['us']:>11.2f}{nk['us']:>11.2f}{nk['us'] / kn['us']:>8.2f}  "
              f"{kn['exact'] and nk['exact']}  ({time.time() - start:.0f} s)", flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0 if all(r["kn"]["exact"] and r["nk"]["exact"] for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
