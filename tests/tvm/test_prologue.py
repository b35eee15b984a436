"""Prologue fusion (``ivit_onnx.engines.tvm.prologue``) and the converters that feed it (Split and Gather as
slices): the merged functions compute the same integers. On cuda they become the tensor-core GEMMs' operand
loads (counted in test_cuda_proxies); here the same merged Relax/TIR is built for llvm and compared bit for
bit with onnxruntime's run of the function bodies, which checks the merge itself."""

from __future__ import annotations

import re

import numpy as np
import onnx
import pytest

tvm = pytest.importorskip("tvm")
from _deit_cases import SMALL_DEIT, deit_pair  # noqa: E402
from tvm import relax  # noqa: E402

from ivit_onnx.engines.tvm import prepare_for_tvm  # noqa: E402
from ivit_onnx.engines.tvm.compile import fuse, import_relax, io_specs, make_target, relax_pipeline  # noqa: E402
from ivit_onnx.engines.tvm.kernels import KERNEL_OPS  # noqa: E402
from ivit_onnx.runners import OrtRunner  # noqa: E402

pytestmark = pytest.mark.tvm
#: what may stay a function of its own beside the GEMMs: the row kernels and the class-token concat
ALONE = re.compile(r"ivit_ilayernorm|ivit_requantize_ivit_shiftmax\d*|fused_concatenate_ivit_iadd")


def _primfuncs(mod) -> list[str]:
    return sorted(gv.name_hint for gv, f in mod.functions_items() if isinstance(f, tvm.tirx.PrimFunc))


def test_merged_gemms_are_exact_on_llvm(tmp_path):
    path = deit_pair(tmp_path, batch=4)["int"]
    model = onnx.load(path)
    prepared = prepare_for_tvm(model, keep_ops=KERNEL_OPS)
    size = SMALL_DEIT["img_size"]
    inputs, _ = io_specs(prepared, {"input": [4, 3, size, size]})
    mod, _ = import_relax(prepared, inputs)
    target = make_target("llvm")
    plain, merged = fuse(mod, target), fuse(mod, target, prologue=True)
    names = _primfuncs(merged)
    assert [n for n in names if "matmul" not in n and not ALONE.fullmatch(n)] == [], names
    assert any(n.startswith("fused_quantize") and "matmul" in n for n in names), names  # input quantize
    assert sum("strided_slice" in n and "matmul" in n for n in names) == 3, names  # Q·Kᵀ (2), P·V; head
    assert len(names) < len(_primfuncs(plain)), _primfuncs(plain)
    with target:
        exe = tvm.compile(merged, target=target, relax_pipeline=relax_pipeline(target))
    vm = relax.VirtualMachine(exe, tvm.cpu())
    rng = np.random.default_rng(0)
    for x in (
        rng.standard_normal((4, 3, size, size)).astype(np.float32),
        np.full((4, 3, size, size), 50.0, np.float32),
    ):  # saturating input quantize
        got = vm["main"](tvm.runtime.tensor(x)).numpy()
        (want,) = OrtRunner(model, "functions").run({inputs[0]["name"]: x}).values()
        np.testing.assert_array_equal(got, want)
