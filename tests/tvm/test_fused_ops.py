"""The fused TIR kernels of ``engines.tvm.kernels`` (the default TVM path): bit-exact against the numpy
reference on the cases the generic generators miss (ShiftGELU's table and division paths, int64 shift-exps,
int32 ILayerNorm rows of 4096), equal to the inlined bodies on a chained block and a DeiT-shaped model, and
on cuda one kernel per row op with at most one 64-bit division (per row), none in the other kernels."""

from __future__ import annotations

import re
import shutil

import numpy as np
import onnx
import pytest
from _tvm_cases import batch_feeds, batch_model, chain_model

from ivit_onnx.opset import OPS
from ivit_onnx.opset.reference import evaluator
from ivit_onnx.opset.shift_exp import max_n

tvm = pytest.importorskip("tvm")
from ivit_onnx.engines.tvm import compile_model, prepare_for_tvm  # noqa: E402
from ivit_onnx.engines.tvm.compile import fuse, import_relax, io_specs, make_target  # noqa: E402
from ivit_onnx.engines.tvm.cuda import cuda_sources, to_ptx  # noqa: E402
from ivit_onnx.engines.tvm.kernels import KERNEL_OPS  # noqa: E402
from ivit_onnx.engines.tvm.kernels.arith import exp_dtype  # noqa: E402
from ivit_onnx.engines.tvm.kernels.elementwise import gelu_table_range  # noqa: E402
from ivit_onnx.engines.tvm.kernels.rows import KERNEL_ATTR  # noqa: E402

pytestmark = pytest.mark.tvm

I32 = np.iinfo(np.int32)


def _check(op: str, cases: list) -> None:
    art = compile_model(batch_model(op, cases))
    assert art.info["kernels"]
    for (inputs, attrs), out in zip(cases, art.run(batch_feeds(cases)), strict=True):
        ref = OPS[op].run(*inputs, **attrs)
        assert out.dtype == ref.dtype
        np.testing.assert_array_equal(out, ref, err_msg=f"{op} {attrs}")


def _extreme(rng, shape, dt) -> np.ndarray:
    info = np.iinfo(dt)
    x = rng.integers(info.min, info.max, shape, endpoint=True, dtype=np.int64)
    x.reshape(-1)[:2] = info.min, info.max
    return x.astype(dt)


def test_shiftgelu_table_and_division_paths():
    """int8 (table of 256), int32 with a DeiT-like x0 (table of ~44k) and a large x0 (per-element division),
    per-tensor and per-channel multipliers."""
    rng = np.random.default_rng(5)
    cases = []
    for xt, x0, n, per_channel in (
        (np.int8, 30, 20, False),
        (np.int32, 1045, 30, True),
        (np.int32, 2**20, 30, False),
        (np.int16, 3, 30, True),
    ):
        x = _extreme(rng, (2, 5, 24), xt)
        x.reshape(-1)[2:8] = [-1, 0, 1, 2 * x0, -2 * x0, x0 // 2]
        mshape = (24,) if per_channel else ()
        b = rng.integers(-(2**20), 2**20, mshape, dtype=np.int64)
        cases.append(
            (
                [x, b, np.full(mshape, 30, np.int64), np.int8(3)],
                {"x0": x0, "n": n, "bits": 15, "qmin": -128, "qmax": 127},
            )
        )
    paths = [gelu_table_range(np.dtype(c[0][0].dtype).name, c[1]["x0"], c[1]["n"]) is not None for c in cases]
    assert paths == [True, True, False, True]
    _check("ShiftGELU", cases)


def test_shiftmax_int64_exp_and_rows():
    """x0 large enough for the int64 shift-exp, rows of 1 and 4096 tokens, constant rows."""
    rng = np.random.default_rng(6)
    big = 2**26
    assert exp_dtype(big, max_n(big, 64)) == "int64" and exp_dtype(1234, 30) == "int32"
    cases = [
        ([_extreme(rng, (3, 64), np.int32), np.int8(-128)], {"x0": big, "n": max_n(big, 64), "bits": 8}),
        ([_extreme(rng, (2, 1), np.int16), np.uint8(0)], {"x0": 7, "n": 30, "bits": 8}),
        ([np.full((1, 2, 4096), 9, np.int32), np.int32(5)], {"x0": 1234, "n": max_n(1234, 4096), "bits": 30}),
    ]
    _check("Shiftmax", cases)


def test_ilayernorm_int32_long_rows():
    """int32 rows (the kernel's int64 row sum) of 4096 and int16 rows at the precondition's edge."""
    rng = np.random.default_rng(7)
    cases = []
    for xt, ch, xmax, shift_in in (
        (np.int32, 4096, 2**24, 0),
        (np.int16, 768, None, 10),
        (np.uint8, 3, None, 16),
    ):
        x = _extreme(rng, (2, ch), xt) if xmax is None else rng.integers(-xmax, xmax, (2, ch)).astype(xt)
        b = rng.integers(-(2**29), 2**29, ch, dtype=np.int64)
        bias = rng.integers(-(2**58), 2**58, ch, dtype=np.int64)
        cases.append(
            (
                [x, b, np.full(ch, 40, np.int64), bias, np.int16(-7)],
                {"shift_in": shift_in, "p": 30, "qmin": -32768, "qmax": 32767},
            )
        )
    _check("ILayerNorm", cases)


def test_kernels_replace_bodies_and_match_them():
    """The private ops reach Relax as kernel calls (row ops as their own scheduled functions, no inlined
    chains), and the kernel build equals the inlined-body build and the reference evaluator."""
    rng = np.random.default_rng(0)
    model = chain_model(rng)
    prepared = prepare_for_tvm(model, keep_ops=KERNEL_OPS)
    assert sorted(n.op_type for n in prepared.graph.node if n.domain == "ai.ivit") == sorted(
        ["Requantize", "ShiftGELU", "Shiftmax", "ILayerNorm", "IAdd"]
    )
    mod, _ = import_relax(prepared, io_specs(prepared)[0])
    fused = fuse(mod, make_target("llvm"))
    rows = [
        f.attrs[KERNEL_ATTR]
        for _, f in fused.functions_items()
        if isinstance(f, tvm.tirx.PrimFunc) and f.attrs is not None and KERNEL_ATTR in f.attrs
    ]
    assert sorted(rows) == ["ILayerNorm", "Shiftmax"]
    x = rng.integers(0, 256, (2, 8, 16)).astype(np.uint8)
    fast = compile_model(model).run({"x": x})
    inlined = compile_model(model, kernels=False).run({"x": x})
    for a, b, ref in zip(fast, inlined, evaluator(model).run(None, {"x": x}), strict=True):
        np.testing.assert_array_equal(a, ref)
        np.testing.assert_array_equal(b, ref)


def div64_per_kernel(ptx: str) -> dict[str, int]:
    """``(div|rem).[su]64`` instructions per ``.entry`` of PTX text."""
    counts, name = {}, None
    for line in ptx.splitlines():
        entry = re.search(r"\.entry\s+(\w+)", line)
        if entry:
            name = entry.group(1)
            counts[name] = 0
        elif name and re.search(r"\b(?:div|rem)\.[su]64\b", line):
            counts[name] += 1
    return counts


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_cuda_row_kernels(arch):
    """One kernel per Shiftmax/ILayerNorm, its one 64-bit division (the row's reciprocal) outside the element
    loops; no 64-bit division or remainder in any other kernel of the chained block."""
    art = compile_model(chain_model(np.random.default_rng(0)), target="cuda", arch=arch)
    (source,) = cuda_sources(art.module)
    names = re.findall(r'extern "C" __global__ void (?:__launch_bounds__\(\d+\) )?(\w+)\(', source)
    assert sorted(n for n in set(names) if n.startswith(("ivit_shiftmax", "ivit_ilayernorm"))) == [
        "ivit_ilayernorm_kernel",
        "ivit_shiftmax_kernel",
    ]
    div = div64_per_kernel(to_ptx(source, arch))
    assert div.pop("ivit_shiftmax_kernel") == 1 and div.pop("ivit_ilayernorm_kernel") == 1
    assert div and not any(div.values()), div
    for kernel in ("ivit_shiftmax_kernel", "ivit_ilayernorm_kernel"):
        assert _division_loops(source, kernel) == [], f"{kernel}: division inside a loop over elements"


def _division_loops(source: str, kernel: str) -> list[str]:
    """The loops of extent > 1 around the 64-bit division of ``kernel``'s definition in CUDA ``source``."""
    body = source[source.index("{", source.index(f" {kernel}(", source.index(f" {kernel}(") + 1)) + 1 :]
    stack: list[str] = []
    for line in body.splitlines():
        if re.search(r"\(int64_t\)\d+ / ", line):
            return [h for h in stack if "for (" in h and not re.search(r"< 1;", h)]
        stack += [line] * line.count("{")
        for _ in range(line.count("}")):
            if not stack:
                raise AssertionError(f"{kernel}: no 64-bit division found")
            stack.pop()
    raise AssertionError(f"{kernel}: no 64-bit division found")


def _fused_names(model, batch_shape: dict) -> list[str]:
    prepared = prepare_for_tvm(model, keep_ops=KERNEL_OPS)
    mod, _ = import_relax(prepared, io_specs(prepared, batch_shape)[0])
    return [
        gv.name_hint
        for gv, f in fuse(mod, make_target("llvm")).functions_items()
        if isinstance(f, tvm.tirx.PrimFunc)
    ]


def digits_through_kernels(tmp_path, **options) -> list[str]:
    """The bundled digits ViT rewritten with ``options``, through the kernels: asserts it equals onnxruntime's
    run of the function bodies on real digits; returns the names of the fused functions."""
    import onnxruntime as ort

    from ivit_onnx import rewrite
    from ivit_onnx.models.bundled import default_model_path
    from ivit_onnx.opset.functions import attach_functions

    rewrite(default_model_path(), tmp_path / "int.onnx", **options)
    model = onnx.load(tmp_path / "int.onnx")
    name = model.graph.input[0].name
    shape = [8] + [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim[1:]]
    from sklearn.datasets import load_digits

    x = (load_digits().images[:8, None] / 16.0).astype(np.float32).reshape(shape)
    (out,) = compile_model(model, shape={name: shape}).run({name: x})
    session = ort.InferenceSession(
        attach_functions(model).SerializeToString(), providers=["CPUExecutionProvider"]
    )
    (expected,) = session.run(None, {name: x})
    np.testing.assert_array_equal(out, expected)
    return _fused_names(model, {name: shape})


def test_digits_model_bitexact_and_fused(tmp_path):
    """The bundled digits ViT (integer rewrite) through the kernels equals onnxruntime's run of the function
    bodies on real digits; every Requantize fuses into a neighbour and every ShiftGELU into its GEMM."""
    names = digits_through_kernels(tmp_path)
    assert "ivit_requantize" not in names and not any(n.startswith("ivit_shiftgelu") for n in names)
    assert any("matmul" in n and "ivit_shiftgelu" in n for n in names), names


def test_isqrt_stages_exact():
    """The kernels' digit-by-digit square root equals ``math.isqrt`` on powers of two, ``k*k - 1``, ``k*k``,
    ``k*k + 1`` and random values up to ``2**62 - 1``."""
    import math

    from tvm import te

    from ivit_onnx.engines.tvm.kernels.arith import isqrt_stages

    rng = np.random.default_rng(8)
    ks = [1, 2, 3, 46340, 46341, 2**31 - 1, 3037000499] + [int(k) for k in rng.integers(1, 2**31, 20)]
    vals = [1 << j for j in range(62)] + [k * k + o for k in ks for o in (-1, 0, 1) if 1 <= k * k + o < 2**62]
    vals += [2**62 - 1] + [int(v) for v in rng.integers(1, 2**62, 200)]
    v = te.placeholder((len(vals),), "int64", name="v")
    lib = tvm.compile(tvm.IRModule({"main": te.create_prim_func([v, isqrt_stages(v)])}), target="llvm")
    inp = tvm.runtime.tensor(np.array(vals, np.int64))
    out = tvm.runtime.tensor(np.zeros(len(vals), np.int64))
    lib["main"](inp, out)
    np.testing.assert_array_equal(out.numpy(), [math.isqrt(x) for x in vals])


# ----------------------------------------------------- the ablation's kernels (IBertGELU, L1LayerNorm)


def test_ibertgelu_and_l1layernorm_kernels():
    """IBertGELU around its clip point, per tensor and per channel; L1LayerNorm on int32 rows of 4096 with a
    shift_in whose centred values need int64 (sum|d| just below 2**62), and int8 rows at int32 ``d``."""
    rng = np.random.default_rng(9)
    gelu = []
    for xt, clip, per_channel in ((np.int8, 50, False), (np.int32, 1051, True), (np.int16, 25000, False)):
        x = _extreme(rng, (2, 5, 24), xt)
        x.reshape(-1)[2:8] = [-1, 0, clip - 1, clip, -clip, -clip - 1]  # each representable in xt
        mshape = (24,) if per_channel else ()
        b = rng.integers(-(2**20), 2**20, mshape, dtype=np.int64)
        attrs = {"clip": clip, "coeff": clip * clip * 11 // 10, "k": 6, "qmin": -128, "qmax": 127}
        gelu.append(([x, b, np.full(mshape, 40, np.int64), np.int8(3)], attrs))
    _check("IBertGELU", gelu)
    ln = []
    for xt, ch, shift_in in ((np.int32, 4096, 17), (np.int8, 768, 16), (np.uint8, 3, 40)):
        x = _extreme(rng, (2, ch), xt)
        b = rng.integers(-(2**29), 2**29, ch, dtype=np.int64)
        bias = rng.integers(-(2**58), 2**58, ch, dtype=np.int64)
        attrs = {"shift_in": shift_in, "p": 30, "qmin": -32768, "qmax": 32767}
        ln.append(([x, b, np.full(ch, 40, np.int64), bias, np.int16(-7)], attrs))
    _check("L1LayerNorm", ln)


def test_digits_ablation_model_bitexact_and_fused(tmp_path):
    """The digits ViT rewritten with ``--gelu ibert --layernorm l1`` through the kernels equals onnxruntime's
    run of its function bodies; every IBertGELU fuses into its GEMM, every L1LayerNorm is one row kernel."""
    names = digits_through_kernels(tmp_path, gelu="ibert", layernorm="l1")
    assert not any(n.startswith("ivit_ibertgelu") for n in names), names
    assert any("matmul" in n and "ivit_ibertgelu" in n for n in names), names
    assert any(n.startswith("ivit_l1layernorm") for n in names), names


@pytest.mark.parametrize("arch", ["sm_90"])
def test_cuda_ablation_kernels(arch):
    """CUDA source without a GPU: one kernel per L1LayerNorm, IBertGELU elementwise; with nvcc, the PTX has
    one 64-bit division per L1LayerNorm kernel (the row's reciprocal, outside the element loops) and none in
    IBertGELU's (its erf polynomial is multiplies)."""
    rng = np.random.default_rng(4)
    x = rng.integers(-3000, 3000, (2, 4, 197)).astype(np.int32)
    gelu = ([x, np.int64(3 << 20), np.int64(44), np.int8(0)],
            {"clip": 1051, "coeff": 1221607, "k": 6, "qmin": -128, "qmax": 127})
    b, bias = rng.integers(-(2**29), 2**29, 197, dtype=np.int64), np.zeros(197, np.int64)
    ln = (
        [x, b, np.full(197, 40, np.int64), bias, np.int8(0)],
        {"shift_in": 16, "p": 30, "qmin": -128, "qmax": 127},
    )
    for op, case in (("IBertGELU", gelu), ("L1LayerNorm", ln)):
        art = compile_model(batch_model(op, [case]), target="cuda", arch=arch)
        (source,) = cuda_sources(art.module)
        kernels = set(re.findall(r'extern "C" __global__ void (?:__launch_bounds__\(\d+\) )?(\w+)\(', source))
        assert kernels == {f"ivit_{op.lower()}_kernel"}, kernels
        if shutil.which("nvcc") is None:
            continue
        div = div64_per_kernel(to_ptx(source, arch))
        assert div == {f"ivit_{op.lower()}_kernel": int(op == "L1LayerNorm")}, div
        if op == "L1LayerNorm":
            assert _division_loops(source, "ivit_l1layernorm_kernel") == []
