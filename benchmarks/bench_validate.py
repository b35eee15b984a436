"""Validation throughput of the integer model (custom-op library, function bodies) vs stock onnxruntime FP32.

    python benchmarks/bench_validate.py [--out DIR] [--batch 8] [--threads 2] [--iters 10] [--profile]
                                        [--what-if]

DeiT-Tiny at 224², random weights: FP32, fake-quant and integer models are built once and cached in
``--out`` (default: ``$TMPDIR/ivit_bench_validate``). Every backend runs the same random batch through
:mod:`ivit_onnx.runners` (the code ``python -m ivit_onnx.validate`` uses), interleaved round by round
so all are measured side by side; the median time per batch gives images/s and the ratio to FP32.
``--profile`` adds onnxruntime's per-op-type profile of each model (time share by op type; nodes of
function bodies are attributed to the private op that called them). ``--what-if`` also times the
function bodies with uint8 MatMulInteger activations (a converter change, emulated; bit-identical).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import inliner

from ivit_onnx import rewrite
from ivit_onnx.runners import OrtRunner


def _torch():
    import torch  # only to build the models (the models extra)

    return torch


def build(out: Path) -> dict[str, Path]:
    """DeiT-Tiny FP32, fake-quant (QDQ) and integer ONNX files, made once."""
    paths = {k: out / f"deit_tiny_{k}.onnx" for k in ("fp32", "fq", "int")}
    if all(p.exists() for p in paths.values()):
        return paths
    from ivit_onnx.models.export import export_onnx
    from ivit_onnx.models.quant import quantize
    from ivit_onnx.models.vit import deit_tiny_patch16_224

    _torch().manual_seed(0)
    model = deit_tiny_patch16_224().eval()
    calib = [_torch().randn(4, 3, 224, 224) for _ in range(2)]
    export_onnx(model, calib[0], paths["fp32"])
    export_onnx(quantize(model, calib), calib[0], paths["fq"])
    rewrite(paths["fq"], paths["int"])
    return paths


def uint8_activations(model: onnx.ModelProto) -> onnx.ModelProto:
    """What-if for the converter: int8 MatMulInteger A operands (zero point 0) as uint8, zero point 128.

    ``u = i + 128`` and ``u - 128 == i``, so the accumulators are bit-identical; onnxruntime then takes its
    u8×s8 GEMM instead of the slow s8×s8 one. Done here with Cast/Add/Cast per operand; the converter
    would instead make the producing Requantize write uint8 with ``y_zero_point = 128`` directly.
    """
    out = onnx.ModelProto()
    out.CopyFrom(model)
    inferred = onnx.shape_inference.infer_shapes(model).graph
    types = {v.name: v.type.tensor_type.elem_type for v in [*inferred.value_info, *inferred.input]}
    out.graph.initializer.extend([onnx.numpy_helper.from_array(np.int16(128), "whatif_128"),
                                  onnx.numpy_helper.from_array(np.uint8(128), "whatif_zp128")])
    nodes = []
    for k, n in enumerate(out.graph.node):
        zp_free = len(n.input) < 3 or not n.input[2]
        if n.op_type == "MatMulInteger" and types.get(n.input[0]) == onnx.TensorProto.INT8 and zp_free:
            a, i16, u8 = n.input[0], f"whatif_a16_{k}", f"whatif_u8_{k}"
            nodes += [onnx.helper.make_node("Cast", [a], [i16], to=onnx.TensorProto.INT16),
                      onnx.helper.make_node("Add", [i16, "whatif_128"], [i16 + "s"]),
                      onnx.helper.make_node("Cast", [i16 + "s"], [u8], to=onnx.TensorProto.UINT8)]
            inputs = [u8, n.input[1], "whatif_zp128", *n.input[3:]]
            del n.input[:]
            n.input.extend(inputs)
        nodes.append(n)
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    return out


def runners(paths: dict[str, Path], threads: int, what_if: bool = False) -> dict:
    fp32, fq, integer = (onnx.load(paths[k]) for k in ("fp32", "fq", "int"))
    out = {"fp32 (onnxruntime)": OrtRunner(fp32, "onnxruntime", threads),
           "fake-quant QDQ (onnxruntime)": OrtRunner(fq, "onnxruntime", threads),
           "int: custom-op library": OrtRunner(integer, "library", threads),
           "int: function bodies": OrtRunner(integer, "functions", threads)}
    if what_if:
        out["what-if: bodies, u8 activations"] = OrtRunner(uint8_activations(integer), "functions", threads)
    for r in out.values():
        r.prepare()
    return out


def measure(rs: dict, x: np.ndarray, iters: int, warmup: int = 2) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {k: [] for k in rs}
    for i in range(warmup + iters):
        for name, r in rs.items():  # interleaved: every backend sees the same machine state
            t = time.perf_counter()
            r.run({"input": x})
            if i >= warmup:
                times[name].append(time.perf_counter() - t)
    return times


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
    from ivit_onnx.opset.ort_library import library_model

    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
    opts.enable_profiling = True
    opts.profile_file_prefix = os.path.join(tempfile.mkdtemp(), "prof")
    opts.log_severity_level = 3
    owner_of: dict[str, str] = {}
    if backend == "library":
        from onnxruntime_extensions import get_library_path

        model = library_model(model)
        opts.register_custom_ops_library(get_library_path())
    elif backend == "functions":
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
        if op.startswith("Ivit"):
            op = op[4:].split("__")[0] + " (library kernel)"
        owner = owner_of.get(e["name"][: -len("_kernel_time")])
        by_type[f"{owner} body" if owner else op] += e["dur"] / 1000.0 / (iters + 1)
        if owner:
            by_body[op] += e["dur"] / 1000.0 / (iters + 1)
    order = sorted(by_type.items(), key=lambda kv: -kv[1])
    return {"by_op": dict(order), "body_ops": dict(sorted(by_body.items(), key=lambda kv: -kv[1]))}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "ivit_bench_validate"))
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--profile", action="store_true", help="also print the per-op-type profile")
    ap.add_argument("--what-if", action="store_true",
                    help="also time the bodies with uint8 (zero point 128) MatMulInteger activations")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    paths = build(out)
    x = np.random.default_rng(0).standard_normal((args.batch, 3, 224, 224)).astype(np.float32)
    rs = runners(paths, args.threads, args.what_if)
    times = measure(rs, x, args.iters)
    base = statistics.median(times["fp32 (onnxruntime)"])
    print(f"DeiT-Tiny 224², batch {args.batch}, {args.threads} threads, median of {args.iters} "
          f"(onnxruntime {ort.__version__})")
    print(f"{'backend':32s} {'ms/batch':>9s} {'images/s':>9s} {'x FP32 time':>11s}")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"{name:32s} {1000 * med:9.1f} {args.batch / med:9.1f} {med / base:11.2f}")
    if args.what_if:
        same = [np.array_equal(*[next(iter(rs[k].run({"input": x}).values()))
                                 for k in ("int: function bodies", "what-if: bodies, u8 activations")])]
        print(f"what-if outputs bit-identical to the converted model's: {same[0]}")
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
