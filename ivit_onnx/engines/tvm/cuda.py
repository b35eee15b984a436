"""CUDA: 8-bit tensor-core matmul schedules that build in TVM 0.27, exact compile flags, generated code.

Every 8-bit GEMM first gets our own schedule (:mod:`.tc_gemm`: the block tile chosen per GEMM so that its
grid fills the GPU); where that fails, dlight's rule below.

dlight's ``MatmulInt8Tensorization`` (wmma m16n16k16 s8*s8->s32) fails in ``InjectSoftwarePipeline``
("fragment_info_" check) on TVM 0.27; the same schedule without its software-pipeline annotations builds
and lowers to ``wmma.mma.sync...s32.s8.s8.s32``. It takes int8 x int8 operands (:mod:`.int8_matmul`) and,
with the same schedule on wmma intrinsics of our own registered from TVM's generators for ``uint8``,
uint8 x uint8 (``...s32.u8.u8.s32``; CUDA has no mixed u8 x s8 wmma). Any extent is taken: both
schedules pad M and N to their block tile and K to 16 and store only the real rows and columns, so a
batch-8 classifier head (M = 8, N = classes) runs on tensor cores too. Other matmuls go to dlight's
generic rules, whose 8-bit multiply-adds nvcc turns into ``dp4a`` on its own; the fused op bodies go to
:class:`.chains.ElementwiseChain` (dlight's Fallback never finishes on them).
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import re
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import tvm
import tvm_ffi
from tvm import s_tir
from tvm.s_tir import dlight as dl
from tvm.s_tir.dlight.analysis import get_root_block
from tvm.s_tir.dlight.gpu.matmul import (
    IterKind,
    MatmulInt8Tensorization,
    detect_iter_traits,
    get_reduction_blocks,
)

from .chains import ElementwiseChain
from .tc_gemm import launch_grids, schedule_tc_gemm, sm_version

#: int8 wmma needs sm_72+
MIN_SM = 72
_PIPELINE_KEYS = ("software_pipeline_order", "software_pipeline_stage")
#: operand dtypes that have a wmma m16n16k16 -> int32 instruction (both operands alike)
TC_DTYPES = ("int8", "uint8")


def _tc_operand_dtype(block) -> str | None:
    """``"int8"``/``"uint8"`` for an 8-bit x 8-bit -> int32 GEMM block (same dtype both sides) with static
    I, J and K extents, else None."""
    dtypes = {str(r.source.dtype) for r in block.reads}
    if len(block.reads) != 2 or len(dtypes) != 1 or str(block.writes[0].source.dtype) != "int32":
        return None
    (dtype,) = dtypes
    traits = detect_iter_traits(block)
    if dtype not in TC_DTYPES or traits is None:
        return None
    kinds = (IterKind.kIter_I, IterKind.kIter_J, IterKind.kIter_K)
    if not all(isinstance(t.extent, tvm.tirx.IntImm) for t in traits[3] if t.kind in kinds):
        return None
    return dtype


#: our uint8 wmma intrinsics (TVM 0.27 registers s8 and f16 ones only), by the role the dlight rule asks for
U8_INTRINS = {
    "load_a": "ivit_wmma_load_16x16x16_u8_a_shared_dyn",
    "load_b": "ivit_wmma_load_16x16x16_u8_b_trans_shared_dyn",
    "compute": "ivit_wmma_sync_16x16x16_u8u8s32_trans",
}
_U8_LOCK = threading.Lock()


def register_u8_wmma() -> dict[str, str]:
    """Register :data:`U8_INTRINS` from TVM's own generators (once; later calls find them registered)."""
    from tvm.s_tir.tensor_intrin import cuda as intrin

    made = {
        "load_a": lambda: intrin.get_wmma_load_intrin(16, 16, 16, "uint8", "shared.dyn", False, False),
        "load_b": lambda: intrin.get_wmma_load_intrin(16, 16, 16, "uint8", "shared.dyn", True, True),
        "compute": lambda: intrin.get_wmma_sync_intrin(16, 16, 16, "uint8", "int32", True),
    }
    for role, name in U8_INTRINS.items():
        if s_tir.TensorIntrin.get(name, allow_missing=True) is None:
            s_tir.TensorIntrin.register(name, *made[role]())
    return dict(U8_INTRINS)


@contextlib.contextmanager
def _uint8_wmma_group():
    """While active, the wmma intrinsic group dlight's int8 rule looks up (``get_wmma_intrin_group``, read
    from its module at each call) names the uint8 load and multiply intrinsics: the schedule is unchanged,
    only the fragments' element type differs (fill and store are the same int32 accumulator ones)."""
    from tvm.s_tir.tensor_intrin import cuda as intrin

    register_u8_wmma()
    original = intrin.get_wmma_intrin_group

    def group(load_scope, store_scope, in_dtype, out_dtype, trans_b):
        if (load_scope, in_dtype, out_dtype, trans_b) != ("shared.dyn", "int8", "int32", True):
            raise ValueError(f"no uint8 wmma intrinsics for {load_scope}, {in_dtype}, {out_dtype}, {trans_b}")
        return {**original(load_scope, store_scope, in_dtype, out_dtype, trans_b), **U8_INTRINS}

    with _U8_LOCK:
        intrin.get_wmma_intrin_group = group
        try:
            yield
        finally:
            intrin.get_wmma_intrin_group = original


#: ``IVIT_CUDA_TC_SCHEDULE=dlight`` skips our tile schedule (dlight's 128x128 rule for every GEMM): A/B runs
SCHEDULE_ENV = "IVIT_CUDA_TC_SCHEDULE"


class Int8TensorCoreMatmul(dl.ScheduleRule):
    """int8 x int8 and uint8 x uint8 -> int32 matmuls (any static extents, padded) on wmma, sm_72+: our
    per-GEMM tile schedule (:func:`.tc_gemm.schedule_tc_gemm`), else dlight's int8 rule without software
    pipelining."""

    def apply(self, func, target, tunable):
        if not isinstance(func, tvm.tirx.PrimFunc) or target.kind.name != "cuda":
            return None
        if sm_version(target) < MIN_SM:
            return None
        sch = s_tir.Schedule(func)
        reductions = get_reduction_blocks(sch, sch.get_child_blocks(get_root_block(sch)))
        dtype = _tc_operand_dtype(sch.get(reductions[0])) if reductions else None
        if dtype is None:
            return None
        if os.environ.get(SCHEDULE_ENV, "") != "dlight":
            try:  # our tile-per-GEMM schedule (tc_gemm.py) first
                return schedule_tc_gemm(func, dtype, target, register_u8_wmma() if dtype == "uint8" else None)
            except Exception:  # noqa: BLE001 - fall back to dlight's fixed 128x128 schedule
                pass
        return self._dlight(func, target, tunable, dtype)

    @staticmethod
    def _dlight(func, target, tunable, dtype):
        """dlight's ``MatmulInt8Tensorization`` (128x128 block tile) without its pipeline annotations."""
        try:
            with _uint8_wmma_group() if dtype == "uint8" else contextlib.nullcontext():
                sch = MatmulInt8Tensorization().apply(func, target, tunable)
        except Exception:  # noqa: BLE001 - any failure leaves the function to the next rule
            return None
        if sch is None:
            return None
        for blk in sch.get_child_blocks(get_root_block(sch)):
            for loop in sch.get_loops(blk):
                for key in _PIPELINE_KEYS:
                    if key in sch.get(loop).annotations:
                        sch.unannotate(loop, key)
        return sch

    def is_target_available(self, target) -> bool:
        return target.kind.name == "cuda"


_GRIDS: contextvars.ContextVar[dict | None] = contextvars.ContextVar("ivit_launch_grids", default=None)


@contextlib.contextmanager
def record_launch_grids():
    """Within the block, :func:`gpu_schedules` adds the launch geometry of every PrimFunc it schedules
    (:func:`.tc_gemm.launch_grids`: name -> [(thread blocks, threads), ...] per kernel) to the dict
    yielded."""
    grids: dict = {}
    token = _GRIDS.set(grids)
    try:
        yield grids
    finally:
        _GRIDS.reset(token)


def gpu_schedules() -> tvm.transform.Pass:
    """dlight's default GPU rules after the int8 tensor-core matmul and the elementwise-chain rule (and the
    launch-geometry record of :func:`record_launch_grids`, when one is active)."""
    rules = dl.ApplyDefaultSchedule(Int8TensorCoreMatmul(), ElementwiseChain(), dl.gpu.Matmul(),
                                    dl.gpu.GEMV(), dl.gpu.Reduction(), dl.gpu.GeneralReduction(),
                                    dl.gpu.Fallback())

    @tvm.transform.module_pass(opt_level=0, name="IvitRecordLaunchGrids")
    def record(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        grids = _GRIDS.get()
        if grids is not None:
            grids.update(launch_grids(mod))
        return mod

    return tvm.transform.Sequential([rules, record])


def cuda_sources(executable) -> list[str]:
    """The CUDA C sources held by a built executable (its module and every import, recursively)."""
    found, stack = [], [executable.mod if hasattr(executable, "mod") else executable]
    while stack:
        mod = stack.pop()
        if mod.kind in ("cuda", "cu"):
            source = mod.inspect_source()
            if source:
                found.append(source)
        stack.extend(mod.imports)
    return found


#: IEEE float on the GPU: correctly rounded division and sqrt, subnormals kept, no mul+add contraction
#: (onnxruntime rounds each float op separately). TVM 0.27 passes ``--use_fast_math`` instead.
EXACT_FLAGS = ("--prec-div=true", "--prec-sqrt=true", "--ftz=false", "--fmad=false")
#: TVM 0.27's own flags for its nvcc path (besides arch and ptxas options): what a default build gets
TVM_FAST_FLAGS = ("--use_fast_math",)
_COMMON_FLAGS = ("-O3", "-w", "-U__CUDA_NO_HALF_OPERATORS__", "-U__CUDA_NO_HALF_CONVERSIONS__",
                 "--expt-relaxed-constexpr")
_CALLBACK = "tvm_callback_cuda_compile"


def nvcc_command(src: str, out: str, arch: str, fmt: str = "fatbin", exact: bool = True,
                 nvcc: str = "nvcc") -> list[str]:
    """The nvcc command line ivit-onnx compiles TVM's CUDA source with (``exact=False``: TVM's fast math)."""
    digits = arch.replace("sm_", "")
    math = EXACT_FLAGS if exact else TVM_FAST_FLAGS
    return [nvcc, f"--{fmt}", *_COMMON_FLAGS, "-gencode", f"arch=compute_{digits},code=sm_{digits}", *math,
            "-o", out, src]


def compile_cuda(source: str, arch: str, fmt: str = "fatbin", exact: bool = True) -> bytes:
    """Compile CUDA C with nvcc (``fmt``: fatbin, cubin or ptx; no GPU needed for ptx)."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        raise FileNotFoundError("nvcc not found (needed for exact CUDA builds and PTX checks)")
    with tempfile.TemporaryDirectory() as tmp:
        src, out = Path(tmp) / "kernels.cu", Path(tmp) / f"kernels.{fmt}"
        src.write_text(source)
        proc = subprocess.run(nvcc_command(str(src), str(out), arch, fmt, exact, nvcc), capture_output=True,
                              text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"nvcc failed on TVM's CUDA source:\n{proc.stdout}{proc.stderr}")
        return out.read_bytes()


def to_ptx(source: str, arch: str, exact: bool = True) -> str:
    """PTX of CUDA C, compiled as :func:`exact_cuda_compile` builds do (``exact=False``: TVM's flags)."""
    return compile_cuda(source, arch, "ptx", exact).decode()


def _current_arch() -> str:
    target = tvm.target.Target.current(allow_none=True)
    arch = str(target.attrs.get("arch", "")) if target is not None else ""
    if not arch.startswith("sm_"):
        major, minor = tvm.cuda(0).compute_version.split(".")
        arch = f"sm_{major}{minor}"
    return arch


def _exact_callback(code, *_target):
    """``tvm_callback_cuda_compile`` for exact builds: nvcc with :data:`EXACT_FLAGS` (fatbin, as TVM's nvcc
    mode returns); without nvcc, TVM's NVRTC path with the same flags appended (later options win)."""
    code = str(code)
    if shutil.which("nvcc") is not None:
        return bytearray(compile_cuda(code, _current_arch(), "fatbin", exact=True))
    from tvm.support import nvcc as tvm_nvcc

    key = "TVM_CUDA_NVRTC_EXTRA_OPTS"
    old = os.environ.get(key)
    os.environ[key] = " ".join(EXACT_FLAGS)
    try:
        return tvm_nvcc.compile_cuda(code, target_format="cubin", compiler="nvrtc")
    finally:
        if old is None:
            del os.environ[key]
        else:
            os.environ[key] = old


@contextlib.contextmanager
def exact_cuda_compile():
    """Within the block, TVM compiles CUDA source (when it does: only where a GPU is present) with
    :func:`_exact_callback` instead of its fast-math default; the previous callback is restored after."""
    previous = tvm_ffi.get_global_func(_CALLBACK, allow_missing=True)
    tvm_ffi.register_global_func(_CALLBACK, _exact_callback, override=True)
    try:
        yield _exact_callback
    finally:
        if previous is not None:
            tvm_ffi.register_global_func(_CALLBACK, previous, override=True)


def compile_callback():
    """The ``tvm_callback_cuda_compile`` TVM would call now."""
    return tvm_ffi.get_global_func(_CALLBACK, allow_missing=True)


#: PTX instructions that multiply 8-bit integers: dp4a and int8 (w)mma
INT8_PTX = re.compile(r"\b(dp4a\.[su]32\.[su]32|w?mma(?:\.[\w]+)*\.[su]8(?:\.[\w]+)*)")


def int8_instructions(ptx: str) -> dict[str, int]:
    """Counts of the int8 multiply instructions (dp4a, int8 mma/wmma) in PTX text."""
    counts: dict[str, int] = {}
    for m in INT8_PTX.finditer(ptx):
        counts[m.group(1)] = counts.get(m.group(1), 0) + 1
    return counts


__all__ = ["EXACT_FLAGS", "Int8TensorCoreMatmul", "compile_callback", "compile_cuda", "cuda_sources",
           "exact_cuda_compile", "gpu_schedules", "int8_instructions", "nvcc_command", "record_launch_grids",
           "register_u8_wmma",
           "sm_version", "to_ptx"]
