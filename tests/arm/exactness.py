"""The exactness checks that tests/arm/run.sh runs on an emulated ARM64 CPU (no pytest, no torch).

1. the GEMM self-check: the library registers for the uint8 forms a compiled model runs, records every form,
   and refuses a form it found inexact only with an exact alternative named, in one line naming the core;
2. the functions backend's int8 x int8 GEMMs are exact on operands of -128 (where onnxruntime's own wraps);
3. ConvIntegers (3x3, strided, padded, depthwise; int8 at -128) and a uint8 x int8 GEMM with -128 weights,
   compiled and run by the library, the function bodies and the interpreter, bit for bit against numpy;
4. the README's rewrite of the bundled digits model, then validate with the library, the function bodies and
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


def register(declared: str | None) -> tuple[str, str]:
    """(the ivit.gemm_check record, the refusal or "") for options declaring ``declared`` forms
    (tests/validate/test_gemm_forms.py uses it too)."""
    from ivit_onnx.opset import ort_library

    opts = ort.SessionOptions()
    if declared is not None:
        opts.add_session_config_entry(ort_library.INT8_GEMMS, declared)
    try:
        opts.register_custom_ops_library(ort_library.native_library())
        error = ""
    except Exception as e:  # noqa: BLE001 - the refusal is what is checked
        error = str(e)
    return opts.get_session_config_entry(ort_library.CHECK), error


def self_check() -> None:
    records = {declared: register(declared) for declared in ("0", "1", None)}
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


#: ConvInteger cases: output -> (input, weights, groups, stride, pad, x zero point, w zero point)
CONVS = {"conv": ("q", "w3", 1, 2, 1, None, None), "dw": ("q", "wdw", 8, 1, 1, None, None),
         "fed": ("xi", "w3", 1, 1, 1, 3, -2), "u8": ("qu", "w3", 1, 2, 0, 128, None)}


def conv_ref(x: np.ndarray, w: np.ndarray, xz: int, wz: int, stride: int, pad: int, group: int) -> np.ndarray:
    """ConvInteger's int32 sums in int64: ``(x - xz)(w - wz)``, padding contributing 0."""
    x = np.pad(x.astype(np.int64) - xz, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    w = w.astype(np.int64) - wz
    (n, _, h, wd), (o, cg, kh, kw) = x.shape, w.shape
    ho, wo = (h - kh) // stride + 1, (wd - kw) // stride + 1
    y = np.zeros((n, o, ho, wo), np.int64)
    for oc in range(o):
        g = oc // (o // group)
        for i in range(ho):
            for j in range(wo):
                win = x[:, g * cg:(g + 1) * cg, i * stride:i * stride + kh, j * stride:j * stride + kw]
                y[:, oc, i, j] = (win * w[oc]).sum(axis=(1, 2, 3))
    return y


def conv_model(seed: int = 0) -> tuple[onnx.ModelProto, dict, dict]:
    """int8 (QuantizeLinear, a graph input) and uint8 activations into 3x3 ConvIntegers (strided, padded,
    depthwise, zero points) with weights at -128, and a uint8 x int8 MatMulInteger with weights at -128; the
    feeds at the extremes, and the numpy int64 references."""
    rng = np.random.default_rng(seed)
    ext = lambda shape, values, dtype: rng.choice(np.array(values), shape).astype(dtype)  # noqa: E731
    consts = {"w3": ext((8, 8, 3, 3), [-128, -128, 127, -127, 0, 5], np.int8),
              "wdw": ext((8, 1, 3, 3), [-128, -128, 127, 1], np.int8),
              "wm": ext((64, 16), [-128, 127, -128, 3], np.int8),
              "s": np.array(1.0, np.float32), "z8": np.array(0, np.int8), "zu": np.array(128, np.uint8),
              "xz_fed": np.array(3, np.int8), "wz_fed": np.array(-2, np.int8),
              "xz_u8": np.array(128, np.uint8), "mz": np.array(5, np.uint8)}
    nodes = [helper.make_node("QuantizeLinear", ["xf", "s", "z8"], ["q"], name="q"),
             helper.make_node("QuantizeLinear", ["xf", "s", "zu"], ["qu"], name="qu"),
             helper.make_node("MatMulInteger", ["xu", "wm", "mz"], ["mm"], name="mm")]
    for out, (x, w, group, stride, pad, xz, wz) in CONVS.items():
        zps = ([f"xz_{out}"] if xz is not None else []) + ([f"wz_{out}"] if wz is not None else [])
        nodes.append(helper.make_node("ConvInteger", [x, w, *zps], [out], name=out, group=group,
                                      strides=[stride] * 2, pads=[pad] * 4, kernel_shape=[3, 3]))
    ins = [helper.make_tensor_value_info("xf", TensorProto.FLOAT, [2, 8, 7, 7]),
           helper.make_tensor_value_info("xi", TensorProto.INT8, [2, 8, 7, 7]),
           helper.make_tensor_value_info("xu", TensorProto.UINT8, [3, 64])]
    outs = [helper.make_tensor_value_info(o, TensorProto.INT32, None) for o in [*CONVS, "mm"]]
    inits = [numpy_helper.from_array(v, k) for k, v in consts.items()]
    g = helper.make_graph(nodes, "convs", ins, outs, inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    feeds = {"xf": ext((2, 8, 7, 7), [-300, -128, -1, 0, 127, 300], np.float32),
             "xi": ext((2, 8, 7, 7), [-128, -128, 127, 3, 0], np.int8),
             "xu": ext((3, 64), [0, 255, 5], np.uint8)}
    acts = {"q": np.clip(feeds["xf"], -128, 127).astype(np.int8), "xi": feeds["xi"],
            "qu": np.clip(feeds["xf"] + 128, 0, 255).astype(np.uint8)}
    want = {out: conv_ref(acts[x], consts[w], xz or 0, wz or 0, stride, pad, group)
            for out, (x, w, group, stride, pad, xz, wz) in CONVS.items()}
    want["mm"] = (feeds["xu"].astype(np.int64) - 5) @ consts["wm"].astype(np.int64)
    return m, feeds, want


def convs() -> None:
    """:func:`conv_model` compiled and run by the library, and by the function bodies and the interpreter."""
    from ivit_onnx import InferenceSession
    from ivit_onnx.opset.ort_library import session
    from ivit_onnx.runners import make_runner

    model, feeds, want = conv_model()

    def wrong(got) -> list[str]:
        return [k for k, v in zip(want, got, strict=True) if not np.array_equal(v, want[k])]

    raw = wrong(ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
                .run(list(want), feeds))
    as_is = f"onnxruntime as converted: {', '.join(raw) + ' wrong' if raw else 'exact'}"
    sess = InferenceSession(model, threads=1)
    runs = {"library": sess.run(list(want), feeds),
            "functions": session(model, "functions").run(list(want), feeds),
            "interpreter": [make_runner("interpreter", model).run(feeds)[k] for k in want]}
    for name, got in runs.items():
        bad = wrong(got)
        detail = f"{'wrong: ' + ', '.join(bad) if bad else 'bit for bit the numpy int64 sums'}; {as_is}"
        check(f"ConvIntegers (3x3, strided, padded, depthwise; -128), u8 x s8 -128 GEMM, {name}", not bad,
              detail + (f"; {sess.compiled.describe()}" if name == "library" else ""))


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
    convs()
    digits(args.samples)


if __name__ == "__main__":
    main()
