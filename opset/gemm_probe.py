"""The GEMM self-check of the custom-op library: onnxruntime's 8-bit GEMM forms at their worst case.

onnxruntime's uint8 x int8 GEMM adds pairs of products in int16 with saturation on x86 CPUs without VNNI
(VPMADDUBSW), so 255 x 127 summed over K comes out wrong there; its int8 x int8 GEMM adds pairs in int16 on
ARM cores without a dot product (Cortex-A72, A64FX), so -128 x -128 wraps there. The library cannot know every
CPU and onnxruntime build it will meet, so when it is registered (``RegisterCustomOps``, ``opset/native``) it
runs this model in a session with a copy of the caller's options and compares each output with the exact sums
below: the same kernels the caller's model will get. One output per GEMM form the session-time rewrites write:

* ``u8s8``, ``u8s8_0``: uint8 activations x constant int8 weights in [-127, 127] (every weight GEMM);
* ``u8u8``: uint8 x uint8 activations (attention's Q.K^T and P.V); ``u8u8_const``: uint8 x constant uint8
  weights (weights holding -128, moved by 128);
* ``conv_u8u8``, ``conv_u8u8_dw``: ConvInteger of uint8 activations and constant uint8 weights (every
  ConvInteger a compiled model keeps, depthwise ones too: onnxruntime 1.31's ConvInteger is exact and ~4x
  faster in that form than with an int8 operand, whose forms wrap on a Cortex-A72 (int8 x int8, int8 x
  uint8) or an AVX2 CPU (int8 x uint8));
* ``s8s8_const``, ``s8s8``, ``conv_s8s8``: the model as converted (int8 x int8), the fallback.

The C side reads the model and the expected outputs from ``native/gemm_probe.h``, which
``python -m ivit_onnx.opset.gemm_probe`` writes from this module (a test checks that it is current).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

M, K, N = 4, 64, 16
#: the value every element of each input is fed (the extremes that overflow an int16 pair sum: 255 x 255,
#: and -128 x -128, whose pairs sum to 32768, which wraps where an int8 x int8 kernel adds pairs in int16)
FEEDS = {"a_u8": (np.uint8, 255, (1, M, K)), "a_u8_0": (np.uint8, 0, (1, M, K)),
         "b_u8": (np.uint8, 255, (K, N)), "a_s8": (np.int8, -128, (1, M, K)), "b_s8": (np.int8, -128, (K, N)),
         "x_u8": (np.uint8, 255, (1, N, 3, 3)), "x_s8": (np.int8, -128, (1, N, 3, 3))}
#: the ConvIntegers' kernel (on the 3 x 3 images ``x_*``: M = 2 x 2 output pixels, each a row of the output)
#: and groups: N in channels over a 2 x 2 window is K = 64 products per output, 4 for the depthwise one
KERNEL = (2, 2)
CONV_GROUPS = {"conv_u8u8": 1, "conv_u8u8_dw": N, "conv_s8s8": 1}
#: the constant weights, by kind: ``s8`` as the compiled model keeps them (in [-127, 127]: a weight of -128
#: goes uint8 at compile, since ARM's uint8 x int8 kernel moves A to int8, where -128 x -128 wraps),
#: ``s8_min`` as converted (-128 too), ``u8`` (such a weight moved to uint8)
WEIGHT_COLUMNS = {"s8": (np.int8, 127, -127), "s8_min": (np.int8, 127, -128), "u8": (np.uint8, 255, 0)}
#: the forms checked: output name -> (A input, B input or the kind of constant weights)
FORMS = {"u8s8": ("a_u8", "s8"), "u8s8_0": ("a_u8_0", "s8"), "u8u8": ("a_u8", "b_u8"),
         "u8u8_const": ("a_u8", "u8"), "conv_u8u8": ("x_u8", "u8"), "conv_u8u8_dw": ("x_u8", "u8"),
         "s8s8_const": ("a_s8", "s8_min"), "s8s8": ("a_s8", "b_s8"), "conv_s8s8": ("x_s8", "s8_min")}
#: forms of the uint8 fast path; the others are the int8 fallback's
FAST = ("u8s8", "u8s8_0", "u8u8", "u8u8_const", "conv_u8u8", "conv_u8u8_dw")


def weights(kind: str = "s8_min") -> np.ndarray:
    """Constant weights of one kind: its two extremes in even and odd columns (both saturating directions)."""
    dtype, even, odd = WEIGHT_COLUMNS[kind]
    w = np.full((K, N), even, dtype)
    w[:, 1::2] = odd
    return w


def conv_weights(form: str) -> np.ndarray:
    """A ConvInteger form's constant weights ``[N, C / group, kh, kw]``: output channel ``n`` holds column
    ``n`` of :func:`weights` (its kind's extremes alternate over the output channels)."""
    per_output = FEEDS[FORMS[form][0]][2][1] // CONV_GROUPS[form] * KERNEL[0] * KERNEL[1]
    w = weights(FORMS[form][1])[:per_output]
    return np.ascontiguousarray(w.T).reshape(N, -1, *KERNEL)


def constant(form: str) -> np.ndarray:
    """The constant B operand of a form (its weights)."""
    return conv_weights(form) if form in CONV_GROUPS else weights(FORMS[form][1])


def feeds() -> dict[str, np.ndarray]:
    return {k: np.full(shape, v, dtype) for k, (dtype, v, shape) in FEEDS.items()}


def expected() -> dict[str, np.ndarray]:
    """The exact int32 result of each form."""
    f = feeds()
    out = {}
    for name, (a, b) in FORMS.items():
        if name in CONV_GROUPS:  # each window of the constant image: its value times the channel's weight sum
            value = int(FEEDS[a][1])
            row = value * conv_weights(name).reshape(N, -1).astype(np.int64).sum(axis=1)
            out[name] = np.broadcast_to(row, (1, M, N)).astype(np.int32)
            continue
        rhs = f[b] if b in FEEDS else weights(b)
        out[name] = (f[a].astype(np.int64) @ rhs.astype(np.int64)).astype(np.int32)
    return out


def model() -> onnx.ModelProto:
    """The probe: one MatMulInteger or ConvInteger per form, opset 13, IR 8 (any onnxruntime since 1.10 loads
    it)."""
    elem = {np.uint8: TensorProto.UINT8, np.int8: TensorProto.INT8}
    inputs = [helper.make_tensor_value_info(k, elem[d], list(s)) for k, (d, _, s) in FEEDS.items()]
    outputs = [helper.make_tensor_value_info(k, TensorProto.INT32, [1, M, N]) for k in FORMS]
    # each constant form has weights of its own: onnxruntime 1.31's int8 -> uint8 weight conversion
    # (session.x64quantprecision) fails at session creation on an initializer shared by two GEMMs
    nodes, consts = [], []
    for name, (a, b) in FORMS.items():
        if b not in FEEDS:
            consts.append(numpy_helper.from_array(constant(name), f"w_{name}"))
        if name not in CONV_GROUPS:
            nodes.append(helper.make_node("MatMulInteger", [a, b if b in FEEDS else f"w_{name}"], [name],
                                          name=name))
            continue
        # ConvInteger [1, N, 2, 2] -> the probe's [1, M, N] (pixels as rows, output channels as columns)
        nodes += [helper.make_node("ConvInteger", [a, f"w_{name}"], [f"{name}_nchw"], name=name,
                                   kernel_shape=list(KERNEL), group=CONV_GROUPS[name]),
                  helper.make_node("Transpose", [f"{name}_nchw"], [f"{name}_nhwc"], perm=[0, 2, 3, 1]),
                  helper.make_node("Reshape", [f"{name}_nhwc", "probe_shape"], [name])]
    consts.append(numpy_helper.from_array(np.array([1, M, N], np.int64), "probe_shape"))
    g = helper.make_graph(nodes, "ivit_gemm_probe", inputs, outputs, consts)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], producer_name="ivit-onnx")
    m.ir_version = 8
    return m


def header() -> str:
    """``native/gemm_probe.h``: the serialized model, the feeds and the expected outputs as C arrays."""
    data = model().SerializeToString()
    rows = [", ".join(f"0x{b:02x}" for b in data[i:i + 20]) for i in range(0, len(data), 20)]
    exp = expected()
    lines = [
        "// Generated by `python -m ivit_onnx.opset.gemm_probe` from opset/gemm_probe.py: do not edit.",
        "// The GEMM self-check model, its inputs (each filled with one value) and the exact outputs.",
        "#pragma once",
        "#include <cstddef>",
        "#include <cstdint>",
        "",
        "namespace ivit_probe {",
        f"constexpr unsigned char MODEL[{len(data)}] = {{",
        *(f"    {r}," for r in rows),
        "};",
        f"constexpr int M = {M}, K = {K}, N = {N};",
        "struct Feed { const char* name; int elem; int value; int64_t dims[4]; size_t rank; };",
        "constexpr Feed FEEDS[] = {",
    ]
    for k, (d, v, s) in FEEDS.items():
        code = 2 if d is np.uint8 else 3  # ONNXTensorElementDataType
        dims = ", ".join(str(x) for x in (*s, 0, 0)[:4])
        lines.append(f'    {{"{k}", {code}, {v}, {{{dims}}}, {len(s)}}},')
    lines += ["};", "struct Form { const char* name; bool fast; int32_t expect[N]; };",
              "constexpr Form FORMS[] = {"]
    for k, v in exp.items():
        row = v.reshape(-1, N)
        assert (row == row[0]).all()  # every row of the output is the same
        values = ", ".join(str(int(x)) for x in row[0])
        lines.append(f'    {{"{k}", {str(k in FAST).lower()}, {{{values}}}}},')
    lines += ["};", "}  // namespace ivit_probe", ""]
    return "\n".join(lines)


def inexact(precision: bool = True) -> dict[str, str]:
    """Run the probe in a plain onnxruntime session (the library does it in C++; this is for sessions without
    it: the functions backend), with ``session.x64quantprecision`` if ``precision``; form -> "gave X instead
    of Y" for each inexact one. ``IVIT_GEMM_PROBE_FAULT`` counts forms as wrong as the library does (`wrap`,
    `uint8`, `all`)."""
    import os

    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    opts.intra_op_num_threads = 1
    if precision:
        opts.add_session_config_entry("session.x64quantprecision", "1")
    sess = ort.InferenceSession(model().SerializeToString(), opts, providers=["CPUExecutionProvider"])
    got = dict(zip(FORMS, sess.run(list(FORMS), feeds()), strict=True))
    fault = os.environ.get("IVIT_GEMM_PROBE_FAULT", "")
    wrong = {}
    for name, want in expected().items():
        fast = name in FAST
        faulty = fault == "all" or (fault == "uint8" and fast) or (fault == "wrap" and not fast)
        bad = np.flatnonzero(got[name] != want)
        if bad.size or faulty:
            i = bad[0] if bad.size else 0
            wrong[name] = f"gave {got[name].flat[i]} instead of {want.flat[i]}" + (
                " (IVIT_GEMM_PROBE_FAULT)" if faulty else "")
    return wrong


HEADER = Path(__file__).resolve().parent / "native" / "gemm_probe.h"

if __name__ == "__main__":
    HEADER.write_text(header())
    print(f"wrote {HEADER}", file=sys.stderr)
