"""CUDA specifics: an int8 tensor-core matmul schedule that builds in TVM 0.27, and access to the generated code.

dlight's ``MatmulInt8Tensorization`` (wmma m16n16k16 s8*s8->s32) fails in ``InjectSoftwarePipeline``
("fragment_info_" check) on TVM 0.27; the same schedule without its software-pipeline annotations builds
and lowers to ``wmma.mma.sync...s32.s8.s8.s32``. Matmuls it does not take fall back to dlight's rules.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import tvm
from tvm import relax, s_tir
from tvm.s_tir import dlight as dl
from tvm.s_tir.dlight.gpu.matmul import MatmulInt8Tensorization, get_index_map, get_reduction_blocks

#: int8 wmma needs sm_72+; each of M, N, K must fill at least one 16x16x16 tile (the schedule pads to 128/16)
MIN_SM = 72
MIN_EXTENT = 16
_PIPELINE_KEYS = ("software_pipeline_order", "software_pipeline_stage")


def sm_version(target: tvm.target.Target) -> int:
    digits = str(target.attrs.get("arch", "")).replace("sm_", "")
    return int(digits) if digits.isdigit() else -1


def _int8_matmul_block(func: tvm.tirx.PrimFunc):
    """The single matmul-like reduction block reading two int8 buffers into int32, else None."""
    sch = s_tir.Schedule(func)
    blocks = sch.get_child_blocks(sch.get_sblock("root") if False else s_tir.dlight.base.analysis.get_root_block(sch)
                                  ) if hasattr(s_tir.dlight.base, "analysis") else None
    return sch, blocks


class Int8TensorCoreMatmul(dl.ScheduleRule):
    """dlight's int8 wmma matmul without software pipelining, for int8 x int8 -> int32 matmuls on sm_72+."""

    def apply(self, func, target, tunable):
        if not isinstance(func, tvm.tirx.PrimFunc) or target.kind.name != "cuda" or sm_version(target) < MIN_SM:
            return None
        sch = s_tir.Schedule(func)
        reductions = get_reduction_blocks(sch, sch.get_child_blocks(sch.get_sblock_root()))
        if not reductions:
            return None
        block = sch.get(reductions[0])
        if get_index_map(block) is None or len(block.reads) < 2:
            return None
        if [str(r.buffer.dtype) for r in block.reads[:2]] != ["int8", "int8"] or str(block.writes[0].buffer.dtype) != "int32":
            return None
        if any(isinstance(v.dom.extent, tvm.tirx.IntImm) and v.dom.extent.value < MIN_EXTENT for v in block.iter_vars):
            return None
        try:
            sch = MatmulInt8Tensorization().apply(func, target, tunable)
        except Exception:  # noqa: BLE001 - any failure leaves the function to the next rule
            return None
        if sch is None:
            return None
        for blk in sch.get_child_blocks(sch.get_sblock_root()):
            for loop in sch.get_loops(blk):
                for key in _PIPELINE_KEYS:
                    if key in sch.get(loop).annotations:
                        sch.unannotate(loop, key)
        return sch

    def is_target_available(self, target) -> bool:
        return target.kind.name == "cuda"


def gpu_schedules() -> tvm.transform.Pass:
    """dlight's default GPU rules with the int8 tensor-core matmul tried first."""
    return dl.ApplyDefaultSchedule(Int8TensorCoreMatmul(), dl.gpu.Matmul(), dl.gpu.GEMV(), dl.gpu.Reduction(),
                                   dl.gpu.GeneralReduction(), dl.gpu.Fallback())


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


def to_ptx(source: str, arch: str, nvcc: str | None = None) -> str:
    """Compile CUDA C to PTX with nvcc (no GPU needed)."""
    nvcc = nvcc or shutil.which("nvcc")
    if nvcc is None:
        raise FileNotFoundError("nvcc not found")
    with tempfile.TemporaryDirectory() as tmp:
        src, ptx = Path(tmp) / "kernel.cu", Path(tmp) / "kernel.ptx"
        src.write_text(source)
        subprocess.run([nvcc, "-ptx", f"-arch={arch}", "-w", str(src), "-o", str(ptx)], check=True,
                       capture_output=True, text=True)
        return ptx.read_text()


#: PTX instructions that multiply 8-bit integers: dp4a and int8 (w)mma
INT8_PTX = re.compile(r"\b(dp4a\.[su]32\.[su]32|w?mma(?:\.[\w]+)*\.[su]8(?:\.[\w]+)*)")


def int8_instructions(ptx: str) -> dict[str, int]:
    """Counts of the int8 multiply instructions (dp4a, int8 mma/wmma) in PTX text."""
    counts: dict[str, int] = {}
    for m in INT8_PTX.finditer(ptx):
        counts[m.group(1)] = counts.get(m.group(1), 0) + 1
    return counts


__all__ = ["Int8TensorCoreMatmul", "cuda_sources", "gpu_schedules", "int8_instructions", "relax", "to_ptx"]
