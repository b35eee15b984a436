"""CUDA: an int8 tensor-core matmul schedule that builds in TVM 0.27, exact compile flags, the generated code.

dlight's ``MatmulInt8Tensorization`` (wmma m16n16k16 s8*s8->s32) fails in ``InjectSoftwarePipeline``
("fragment_info_" check) on TVM 0.27; the same schedule without its software-pipeline annotations builds
and lowers to ``wmma.mma.sync...s32.s8.s8.s32``. It needs int8 operands (:mod:`.int8_matmul`). Smaller
matmuls go to dlight's generic rules, whose int8 multiply-adds nvcc turns into ``dp4a`` on its own; the
fused op bodies go to :class:`.chains.ElementwiseChain` (dlight's Fallback never finishes on them).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import tempfile
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

#: int8 wmma needs sm_72+; each of M, N, K must fill at least one 16x16x16 tile (the schedule pads to 128/16)
MIN_SM = 72
MIN_EXTENT = 16
_PIPELINE_KEYS = ("software_pipeline_order", "software_pipeline_stage")


def sm_version(target: tvm.target.Target) -> int:
    digits = str(target.attrs.get("arch", "")).replace("sm_", "")
    return int(digits) if digits.isdigit() else -1


def _int8_gemm_large_enough(block) -> bool:
    """An int8 x int8 -> int32 GEMM block whose fused I, J and K extents are static and >= MIN_EXTENT."""
    if len(block.reads) != 2 or [str(r.source.dtype) for r in block.reads] != ["int8", "int8"]:
        return False
    if str(block.writes[0].source.dtype) != "int32":
        return False
    traits = detect_iter_traits(block)
    if traits is None:
        return False
    extents = {IterKind.kIter_I: 1, IterKind.kIter_J: 1, IterKind.kIter_K: 1}
    for trait in traits[3]:
        if trait.kind in extents:
            if not isinstance(trait.extent, tvm.tirx.IntImm):
                return False
            extents[trait.kind] *= trait.extent.value
    return min(extents.values()) >= MIN_EXTENT


class Int8TensorCoreMatmul(dl.ScheduleRule):
    """dlight's int8 wmma matmul without software pipelining, for int8 x int8 -> int32 matmuls on sm_72+."""

    def apply(self, func, target, tunable):
        if not isinstance(func, tvm.tirx.PrimFunc) or target.kind.name != "cuda":
            return None
        if sm_version(target) < MIN_SM:
            return None
        sch = s_tir.Schedule(func)
        reductions = get_reduction_blocks(sch, sch.get_child_blocks(get_root_block(sch)))
        if not reductions or not _int8_gemm_large_enough(sch.get(reductions[0])):
            return None
        try:
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


def gpu_schedules() -> tvm.transform.Pass:
    """dlight's default GPU rules after the int8 tensor-core matmul and the elementwise-chain rule."""
    return dl.ApplyDefaultSchedule(Int8TensorCoreMatmul(), ElementwiseChain(), dl.gpu.Matmul(), dl.gpu.GEMV(),
                                   dl.gpu.Reduction(), dl.gpu.GeneralReduction(), dl.gpu.Fallback())


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
           "exact_cuda_compile", "gpu_schedules", "int8_instructions", "nvcc_command", "sm_version", "to_ptx"]
