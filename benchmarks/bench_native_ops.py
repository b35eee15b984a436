"""CPU time of the custom-op library's kernels on a DeiT model's own first-block tensors (onnxruntime).

    python benchmarks/bench_native_ops.py [--model deit_tiny] [--out DIR] [--iters 25] [--lib OTHER.so]

What each session-time change of the library path buys, kernel by kernel, without the rest of the model
(one thread, so that sharing the cores with other jobs distorts it least):

* each Requantize chain (after fc1, after Q·Kᵀ) as the three library nodes the converter writes vs the one
  fused op :mod:`ivit_onnx.engines.onnxruntime.chain_fold` makes of them (outputs compared bit for bit);
* the attention GEMMs (Q·Kᵀ, P·V) with the operand types before and after
  :mod:`ivit_onnx.engines.onnxruntime.u8_gemm` kept
  B operands int8: uint8 × uint8 vs uint8 × int8;
* every private op of the block as the library runs it; ``--lib`` runs the same nodes on another build of
  the library too (e.g. an older commit's), side by side.

The tensors come from the library runner on a random batch of 8 (the models of
``bench_validate.build``, cached in ``--out``). Times are process CPU time per call, median of ``--iters``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_validate import build, cpu_model  # noqa: E402

from ivit_onnx.engines.onnxruntime.chain_fold import fold_chains  # noqa: E402
from ivit_onnx.opset import DOMAIN  # noqa: E402
from ivit_onnx.opset.functions import attach_functions  # noqa: E402
from ivit_onnx.opset.ort_library import native_library  # noqa: E402
from ivit_onnx.runners import OrtRunner  # noqa: E402

BLOCK = "blocks.0/"


def block_nodes(path: Path) -> tuple[list[onnx.NodeProto], dict[str, np.ndarray], set[str]]:
    """The first block's private-op and GEMM nodes as the library runs them (before the chain fold), every
    tensor they read, and which of those are constants."""
    model = OrtRunner(onnx.load(path), "library", 1, chain_fold=False).session_model()
    nodes = [
        n
        for n in model.graph.node
        if BLOCK in n.name and (n.domain == DOMAIN or n.op_type == "MatMulInteger")
    ]
    consts = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    wanted = sorted({i for n in nodes for i in n.input if i and i not in consts})
    x = np.random.default_rng(0).standard_normal((8, 3, 224, 224)).astype(np.float32)
    as_is = OrtRunner(model, "library", 1, u8_gemm=False, bias_fold=False, patch_gemm=False, chain_fold=False)
    values = as_is.run_with({"input": x}, wanted)  # the rewrites are in the model already: nothing to decode
    return nodes, {**consts, **{k: values[k] for k in wanted}}, set(consts)


def one_model(nodes: list[onnx.NodeProto], values: dict, fed: int = 1) -> tuple[onnx.ModelProto, dict]:
    """A model of ``nodes``: the first node's first ``fed`` inputs fed, every other input an initializer."""
    feeds = {i: values[i] for i in nodes[0].input[:fed]}
    made = {o for n in nodes for o in n.output}
    names = sorted({i for n in nodes for i in n.input if i and i not in feeds and i not in made})
    graph = helper.make_graph(
        nodes,
        "nodes",
        [
            helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
            for k, v in feeds.items()
        ],
        [helper.make_empty_tensor_value_info(nodes[-1].output[0])],
        [numpy_helper.from_array(values[i], i) for i in names],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid(DOMAIN, 1)]
    return attach_functions(helper.make_model(graph, ir_version=10, opset_imports=opsets)), feeds


def cpu_ms(model: onnx.ModelProto, feeds: dict, lib: str, iters: int) -> tuple[float, np.ndarray]:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.log_severity_level = 1, 3
    opts.register_custom_ops_library(lib)
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    out = sess.run(None, feeds)[0]
    times = []
    for _ in range(iters):
        t = time.process_time()
        sess.run(None, feeds)
        times.append(time.process_time() - t)
    return 1000 * statistics.median(times), out


def chains(nodes, values, lib: str, iters: int) -> None:
    print("\nRequantize chains, three library nodes vs the fused op (CPU ms per call):")
    by_out = {n.input[0]: n for n in nodes}
    for head in nodes:
        if head.op_type != "Requantize" or head.output[0] not in by_out:
            continue
        chain = [head]
        while chain[-1].output[0] in by_out and len(chain) < 3:
            chain.append(by_out[chain[-1].output[0]])
        if len(chain) < 3 or chain[-1].op_type not in ("ShiftGELU", "Shiftmax"):
            continue
        model, feeds = one_model(chain, values)
        folded, n = fold_chains(model)
        (a, ya), (b, yb) = cpu_ms(model, feeds, lib, iters), cpu_ms(folded, feeds, lib, iters)
        same = np.array_equal(ya, yb)
        print(
            f"  {head.name.split(BLOCK)[1]:45s} -> {chain[-1].op_type:9s} {a:7.3f} -> {b:7.3f} ms"
            f"  (folded {n}, bit-identical: {same})"
        )


def attention(nodes, values, consts: set[str], lib: str, iters: int) -> None:
    print("\nattention GEMMs (both operands activations), by operand types (CPU ms per call):")
    node = helper.make_node("MatMulInteger", ["a", "b", "za", "zb"], ["y"])
    for mm in nodes:
        if mm.op_type != "MatMulInteger" or mm.input[1] in consts:
            continue
        a, b = values[mm.input[0]], values[mm.input[1]]
        a = a if a.dtype == np.uint8 else (a.astype(np.int16) + 128).astype(np.uint8)
        b8 = b if b.dtype == np.int8 else (b.astype(np.int16) - 128).astype(np.int8)
        row = []
        for bb in ((b8.astype(np.int16) + 128).astype(np.uint8), b8):
            vals = {"a": a, "b": bb, "za": np.array(128, np.uint8), "zb": np.array(0, bb.dtype)}
            row.append(cpu_ms(*one_model([node], vals, fed=2), lib, iters)[0])
        print(f"  {mm.name.split(BLOCK)[1]:45s} uint8 x uint8 {row[0]:7.3f}   uint8 x int8 {row[1]:7.3f}")


def private_ops(nodes, values, libs: list[str], iters: int) -> None:
    print("\nprivate ops of the block (CPU ms per call): " + "  vs  ".join(Path(lib).name for lib in libs))
    for node in nodes:
        if node.domain != DOMAIN:
            continue
        model, feeds = one_model([node], values)
        times = [cpu_ms(model, feeds, lib, iters)[0] for lib in libs]
        print(
            f"  {node.op_type:11s} {node.name.split(BLOCK)[1]:45s} " + "  ".join(f"{t:7.3f}" for t in times)
        )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "ivit_bench_validate"))
    ap.add_argument("--model", default="deit_tiny", choices=["deit_tiny", "deit_small", "deit_base"])
    ap.add_argument("--iters", type=int, default=25)
    ap.add_argument("--lib", help="another build of the custom-op library to time the private ops on as well")
    args = ap.parse_args(argv)
    lib = native_library()
    if lib is None:
        print("the native custom-op library was not built", file=sys.stderr)
        return 1
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print(f"CPU: {cpu_model()}; {args.model}, batch 8, onnxruntime {ort.__version__}, 1 thread, CPU time")
    nodes, values, consts = block_nodes(build(out, args.model)["int"])
    chains(nodes, values, lib, args.iters)
    attention(nodes, values, consts, lib, args.iters)
    private_ops(nodes, values, [lib, *([args.lib] if args.lib else [])], args.iters)
    return 0


if __name__ == "__main__":
    sys.exit(main())
