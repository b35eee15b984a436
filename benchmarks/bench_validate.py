"""Validation throughput of the integer model (custom-op library, function bodies) vs stock onnxruntime FP32.

    python benchmarks/bench_validate.py [--model deit_tiny,deit_small] [--out DIR] [--batch 8] [--threads 2]
                                        [--iters 10] [--warmup 2] [--steps] [--bodies-once] [--profile]
                                        [--json FILE]

DeiT-Tiny and DeiT-Small (``--model``; Base, Swin-T too) at 224², random weights: FP32, fake-quant and integer
models are built once and cached in ``--out`` (default: ``$TMPDIR/ivit_bench_validate``). Every backend
runs the same random batch through :mod:`ivit_onnx.runners` (the code ``python -m ivit_onnx.validate`` uses),
interleaved round by round so all are measured side by side; the median time per batch gives images/s
and the ratio to FP32 (p90 too). ``--profile`` adds onnxruntime's per-op-type profile of each model (time
share by op type; nodes of function bodies are attributed to the private op that called them). The library
backend is the fast path: the native custom-op library (``opset/native``) on the onnxruntime engine's
compiled model (:mod:`ivit_onnx.engines.onnxruntime`: GEMM operands re-encoded as uint8, GEMM bias Adds
folded into Requantize, the patch embedding as a GEMM and Requantize chains as table lookups);
``--steps`` times it without each rewrite. The function bodies run the graph as converted. Both must give
the same bits (exit status 1 if not; the line ``exact: library == function bodies: yes|no``). Peers: OpenVINO
FP32 on the FP32 model and OpenVINO on the fake-quant QDQ model (its int8 path), with the same thread count,
when the ``openvino`` package is installed (else a one-line note). Timing, statistics (median, p90,
images/s, ratio to FP32) and the device line (:func:`ivit_onnx.cpu.describe`) come from
:mod:`ivit_onnx.bench`, the engine ``ivit-onnx bench`` uses; ``--json FILE`` writes every model's results.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import inliner

from ivit_onnx import bench, cpu, rewrite
from ivit_onnx.opset import OPS
from ivit_onnx.runners import OrtRunner


def _torch():
    import torch  # only to build the models (the models extra)

    return torch


def build(out: Path, name: str = "deit_tiny") -> dict[str, Path]:
    """FP32, fake-quant (QDQ) and integer ONNX files of DeiT-``name`` (random weights), made once."""
    paths = {k: out / f"{name}_{k}.onnx" for k in ("fp32", "fq", "int")}
    if all(p.exists() for p in paths.values()):
        return paths
    from ivit_onnx.models import swin, vit
    from ivit_onnx.models.export import export_onnx
    from ivit_onnx.models.quant import quantize

    _torch().manual_seed(0)
    model = (  # swin_tiny: #11's Swin-T (window 7)
        swin.swin_tiny_patch4_window7_224() if name == "swin_tiny" else getattr(vit, f"{name}_patch16_224")()
    ).eval()
    calib = [_torch().randn(4, 3, 224, 224) for _ in range(2)]
    export_onnx(model, calib[0], paths["fp32"])
    export_onnx(quantize(model, calib), calib[0], paths["fq"])
    rewrite(paths["fq"], paths["int"])
    return paths


FP32 = "fp32 (onnxruntime)"
LIBRARY = "int: custom-op library"
BODIES = "int: function bodies"


def runners(paths: dict[str, Path], threads: int, steps: bool = False, bodies: bool = True) -> dict:
    """The runners, by label; ``steps`` adds the library without each session-time step (what each buys)."""
    fp32, fq, integer = (onnx.load(paths[k]) for k in ("fp32", "fq", "int"))
    out = {FP32: OrtRunner(fp32, "onnxruntime", threads),
           "fake-quant QDQ (onnxruntime)": OrtRunner(fq, "onnxruntime", threads),
           LIBRARY: OrtRunner(integer, "library", threads)}
    if steps:  # each row drops one more session-time rewrite
        off: dict = {}
        for label, flag in (("int: library, no chain fold", "chain_fold"),
                            ("int: + no patch GEMM", "patch_gemm"),
                            ("int: + no bias fold", "bias_fold"),
                            ("int: + int8 GEMMs (no u8 re-encoding)", "u8_gemm")):
            off[flag] = False
            out[label] = OrtRunner(integer, "library", threads, **off)
    if bodies:
        out[BODIES] = OrtRunner(integer, "functions", threads)
    return out  # ivit_onnx.bench prepares them (untimed)


def peers(paths: dict[str, Path], threads: int, feeds: dict) -> dict:
    """OpenVINO FP32 on the FP32 model and OpenVINO on the fake-quant QDQ model (its int8 path); each is
    skipped with a note by :func:`ivit_onnx.bench.bench` when openvino is missing or refuses the model."""
    return {"fp32 (openvino)": bench.openvino_peer(paths["fp32"], threads, feeds),
            "fake-quant QDQ (openvino int8)": bench.openvino_peer(paths["fq"], threads, feeds, int8=True)}


def cpu_model() -> str:
    """The CPU, as every benchmark names it (:func:`ivit_onnx.cpu.describe`: model and 8-bit GEMM ISA)."""
    return cpu.describe()


def named_inline(model: onnx.ModelProto) -> tuple[onnx.ModelProto, dict[str, str]]:
    """The model with its function bodies inlined and each body node named after its call (for profiling)."""
    from ivit_onnx.certify import call_sites

    flat = inliner.inline_local_functions(model)
    owner_of = {}
    for i, (call, node) in enumerate(zip(call_sites(model, flat), flat.graph.node, strict=True)):
        if call is not None:
            node.name = f"{call.name}::{node.op_type}_{i}"
            owner_of[node.name] = call.op_type
    return flat, owner_of


def profile(model: onnx.ModelProto, backend: str, x: np.ndarray, threads: int, iters: int = 3) -> dict:
    """Kernel time per op type (ms per batch) from onnxruntime's profiler, body nodes under their op."""
    from ivit_onnx.engines.onnxruntime import compile_model
    from ivit_onnx.engines.onnxruntime.session import register, session_options
    from ivit_onnx.runners import exact_weight_gemms

    opts = session_options(threads)  # as the runners' sessions
    opts.enable_profiling = True
    opts.profile_file_prefix = os.path.join(tempfile.mkdtemp(), "prof")
    owner_of: dict[str, str] = {}
    if backend == "library":
        model = register(opts, compile_model(model).model, threads)  # the engine's artifact, as the runner
    elif backend == "functions":
        exact_weight_gemms(opts)
        model, owner_of = named_inline(model)  # what ORT's own inlining does, with names kept
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    sess.run(None, {"input": x})
    for _ in range(iters):
        sess.run(None, {"input": x})
    events = json.loads(Path(sess.end_profiling()).read_text())
    by_type: dict[str, float] = defaultdict(float)
    by_body: dict[str, float] = defaultdict(float)
    for e in events:
        if e.get("cat") != "Node" or not e.get("name", "").endswith("_kernel_time"):
            continue
        op = e["args"].get("op_name", "?")
        if op.startswith("Ivit"):  # the onnxruntime-extensions fallback's kernel names
            op = op[4:].split("__")[0]
        if op in OPS:
            op += " (library kernel)"
        owner = owner_of.get(e["name"][: -len("_kernel_time")])
        by_type[f"{owner} body" if owner else op] += e["dur"] / 1000.0 / (iters + 1)
        if owner:
            by_body[op] += e["dur"] / 1000.0 / (iters + 1)
    order = sorted(by_type.items(), key=lambda kv: -kv[1])
    return {"by_op": dict(order), "body_ops": dict(sorted(by_body.items(), key=lambda kv: -kv[1]))}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "ivit_bench_validate"))
    ap.add_argument("--model", default="deit_tiny,deit_small",
                    help="comma list of deit_tiny, deit_small, deit_base, swin_tiny "
                         "(default: deit_tiny,deit_small)")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--iters", type=int, default=10, help="timed rounds (default 10)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed rounds first (default 2)")
    ap.add_argument("--steps", action="store_true",
                    help="also time the library without each session-time rewrite, one more per row")
    ap.add_argument("--bodies-once", action="store_true",
                    help="run the function bodies once, for the bit-exactness check only (they are slow)")
    ap.add_argument("--profile", action="store_true", help="also print the per-op-type profile")
    ap.add_argument("--no-peers", action="store_true", help="do not time the OpenVINO peers")
    ap.add_argument("--json", metavar="FILE", help="also write every model's results here")
    args = ap.parse_args(argv)
    models = args.model.split(",")
    bad = [m for m in models if m not in ("deit_tiny", "deit_small", "deit_base", "swin_tiny")]
    if bad:
        ap.error(f"unknown model(s) {bad}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print(bench.device_line(bench.device(args.threads)))
    ok, results = True, {}
    for name in models:
        report = run_model(args, name, build(out, name))
        ok = report.all_exact and ok
        results[name] = report.to_dict()
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return 0 if ok else 1


def run_model(args, name: str, paths: dict[str, Path]) -> bench.Report:
    """Time, check and (optionally) profile one model; its report says whether the library matched the
    function bodies (``report.all_exact``)."""
    x = np.random.default_rng(0).standard_normal((args.batch, 3, 224, 224)).astype(np.float32)
    feeds = {"input": x}
    rs = runners(paths, args.threads, steps=args.steps, bodies=not args.bodies_once)
    candidates = dict(rs)
    if not args.no_peers:
        candidates.update(peers(paths, args.threads, feeds))
    title = f"\n{name} 224², batch {args.batch}, {args.threads} threads"
    report = bench.bench(candidates, feeds=feeds, batch=args.batch, iters=args.iters, warmup=args.warmup,
                         baseline=FP32, threads=args.threads, title=title)
    bodies = rs[BODIES] if BODIES in rs else OrtRunner(onnx.load(paths["int"]), "functions", args.threads)
    names = rs[LIBRARY].output_names
    report.exact["library"] = bench.same_bits(bench.as_list(rs[LIBRARY].run(feeds), names),
                                              bench.as_list(bodies.run(feeds), names))
    print(report.text(device=False))
    ratio = report.row(LIBRARY).ratio
    verdict = "met" if ratio <= 0.67 else "MISSED"
    print(f"{name}: custom-op library / FP32 time = {ratio:.2f} (#15 goal <= 0.67: {verdict})")
    print(f"library: {rs[LIBRARY].describe()}")
    if args.profile:
        integer = onnx.load(paths["int"])
        for label, model, backend in (("fp32", onnx.load(paths["fp32"]), "onnxruntime"),
                                      ("int: function bodies", integer, "functions"),
                                      ("int: custom-op library", integer, "library")):
            prof = profile(model, backend, x, args.threads)
            total = sum(prof["by_op"].values())
            print(f"\nprofile {label}: {total:.1f} ms of kernel time per batch")
            for op, ms in list(prof["by_op"].items())[:12]:
                print(f"  {op:34s} {ms:9.2f} ms {100 * ms / total:5.1f}%")
            if prof["body_ops"]:
                body = sum(prof["body_ops"].values())
                print(f"  inside the bodies ({body:.1f} ms), by standard op:")
                for op, ms in list(prof["body_ops"].items())[:10]:
                    print(f"    {op:32s} {ms:9.2f} ms {100 * ms / total:5.1f}%")
    return report


if __name__ == "__main__":
    sys.exit(main())
