"""The exactness checks that tests/arm/run.sh runs on an emulated ARM64 CPU (no pytest, no torch).

1. the GEMM self-check: the library registers for the uint8 forms a compiled model runs, records every form,
   and refuses a form it found inexact only with an exact alternative named, in one line naming the core;
2. the functions backend's int8 x int8 GEMMs are exact on operands of -128 (where onnxruntime's own wraps);
3. the README's rewrite of the bundled digits model, then validate with the library, the function bodies and
   the interpreter bit for bit (random inputs: no scikit-learn here), then ``ivit-onnx run`` and
   ``ivit_onnx.InferenceSession`` giving the same bits.
Prints one line per check; exits 1 on the first failure.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
import tempfile
import time

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper


def check(name: str, ok: bool, detail: str) -> None:
    print(f"{'PASS' if ok else 'FAIL'} {name}: {detail}", flush=True)
    if not ok:
        sys.exit(1)


def self_check() -> None:
    from ivit_onnx.opset import ort_library

    records = {}
    for declared in ("0", "1", None):
        opts = ort.SessionOptions()
        if declared is not None:
            opts.add_session_config_entry(ort_library.INT8_GEMMS, declared)
        try:
            opts.register_custom_ops_library(ort_library.native_library())
            error = ""
        except Exception as e:  # noqa: BLE001 - the refusal is what is checked
            error = str(e)
        records[declared] = (opts.get_session_config_entry(ort_library.CHECK), error)
    from ivit_onnx.opset.gemm_probe import FAST

    record, error = records["0"]
    forms = dict(f.split(" ", 1) for f in record.split("; forms: ")[-1].split(", "))
    exact = all(forms.get(f) == "exact" for f in FAST)
    check("self-check, uint8 forms", not error and exact, record or error)
    for declared in ("1", None):
        record, error = records[declared]
        if error:
            line = error[error.find("ai.ivit"):]
            named = "ivit.int8_gemms=" in line and "arm64 CPU" not in line and "\n" not in line.strip()
            check(f"self-check, ivit.int8_gemms={declared}: one-line refusal naming an alternative", named,
                  line)
        else:
            check(f"self-check, ivit.int8_gemms={declared}", "inexact" not in record, record)


def functions_backend() -> None:
    """int8 x int8 MatMulInteger of two activations and of an activation and a weight, at -128 x -128."""
    from ivit_onnx.int8_gemms import wraps
    from ivit_onnx.opset.ort_library import session

    k, n = 64, 16
    w = np.full((k, n), -128, np.int8)
    x = helper.make_tensor_value_info("x", TensorProto.INT8, [2, k])
    y = helper.make_tensor_value_info("y", TensorProto.INT8, [k, n])
    outs = [helper.make_tensor_value_info(o, TensorProto.INT32, [2, n]) for o in ("xy", "xw")]
    nodes = [helper.make_node("MatMulInteger", ["x", "y"], ["xy"], name="xy"),
             helper.make_node("MatMulInteger", ["x", "w"], ["xw"], name="xw")]
    g = helper.make_graph(nodes, "s8s8", [x, y], outs, [numpy_helper.from_array(w, "w")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    feeds = {"x": np.full((2, k), -128, np.int8), "y": np.full((k, n), -128, np.int8)}
    want = feeds["x"].astype(np.int64) @ w.astype(np.int64)
    got = session(m, "functions").run(None, feeds)
    ok = all(np.array_equal(v, want) for v in got)
    check("functions backend, int8 x int8 at -128", ok,
          f"{'rewritten as uint8: ' + wraps() if wraps() else 'onnxruntime int8 x int8 exact here'}")


def digits(samples: int) -> None:
    from ivit_onnx import InferenceSession, cli

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "digits_int.onnx")
        t = time.time()
        check("rewrite digits", cli.main(["rewrite", "digits", "-o", path]) == 0, f"{time.time() - t:.0f} s")
        t = time.time()
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            rc = cli.main(["validate", path, "--reference", "digits", "--samples", str(samples),
                           "--backends", "library,functions,interpreter", "--threads", "1"])
        print(out.getvalue(), end="")
        check("validate --backends library,functions,interpreter", rc == 0, f"{time.time() - t:.0f} s")
        model = onnx.load(path)
        name = model.graph.input[0].name
        dims = [d.dim_value or 4 for d in model.graph.input[0].type.tensor_type.shape.dim]
        x = np.random.default_rng(0).uniform(0, 16, dims).astype(np.float32)
        sess = InferenceSession(path, threads=1)
        got = sess.run(None, {name: x})
        want = ort_functions(model, {name: x})
        same = all(np.array_equal(a, b) for a, b in zip(got, want, strict=True))
        check("InferenceSession == function bodies", same, sess.describe())
        check("ivit-onnx run", cli.main(["run", path]) == 0, "exit 0")


def ort_functions(model: onnx.ModelProto, feeds: dict) -> list:
    from ivit_onnx.opset.ort_library import session

    return session(model, "functions").run(None, feeds)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--samples", type=int, default=32)
    args = p.parse_args()
    from ivit_onnx import cpu

    print(f"cpu: {cpu.describe()}; onnxruntime {ort.__version__}", flush=True)
    self_check()
    functions_backend()
    digits(args.samples)


if __name__ == "__main__":
    main()
