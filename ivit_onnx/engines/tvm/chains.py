"""Schedule the fused elementwise chains of the inlined op bodies without recomputing shared stages.

A function body computes e.g. ``floor(a / d)`` as ``(a - Mod(a, d)) / d``: ``a`` is read twice, and ShiftExp
reads ``p`` three times. Inlining every stage (dlight's Fallback on GPUs, meta-schedule's auto-inline)
recomputes a stage once per read, which grows exponentially along the chain (ShiftGELU did not compile in 10
minutes for cuda); not scheduling them at all (TVM's llvm default) writes every one of ~70 int64 stages to a
full-size buffer. This rule inlines stages read once and computes the others once per output element (cuda:
per thread, in registers) or per chunk of whole rows (llvm: in stack buffers, chunks in parallel).
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import s_tir
from tvm.s_tir import dlight as dl
from tvm.s_tir.dlight.analysis import get_root_block, normalize_prim_func
from tvm.s_tir.dlight.base import max_threads_per_block

#: output elements per parallel task on the CPU (the kept stages' buffers hold a chunk each): whole innermost
#: axes, at least CPU_MIN_CHUNK where the shape allows, at most CPU_MAX_CHUNK
CPU_MIN_CHUNK, CPU_MAX_CHUNK = 256, 4096


def _load_counts(sch: s_tir.Schedule, blocks) -> dict:
    """How many loads of each buffer the given blocks' bodies hold."""
    counts: dict = {}

    def visit(load):
        counts[load.source.data] = counts.get(load.source.data, 0) + 1

    for block in blocks:
        tvm_ffi.structural_walk(sch.get(block).body, [(tvm.ir.TensorLoad, visit)])
    return counts


class ElementwiseChain(dl.ScheduleRule):
    """Injective fused functions with one output: inline single-read stages, compute the rest once."""

    def apply(self, func, target, tunable):
        kind = target.kind.name
        if not isinstance(func, tvm.tirx.PrimFunc) or kind not in ("cuda", "llvm"):
            return None
        sch = s_tir.Schedule(func)
        infos = normalize_prim_func(sch)
        if infos is None or len(infos) < 2 or not all(i.is_injective() for i in infos):
            return None
        outputs = sch.get_output_blocks(get_root_block(sch))
        if len(outputs) != 1:
            return None
        out = outputs[0]
        stages = [i.block_rv for i in infos if not sch.get(i.block_rv).same_as(sch.get(out))]
        uses = _load_counts(sch, [i.block_rv for i in infos])
        kept = []
        for block in reversed(stages):
            written = sch.get(block).writes
            if len(written) == 1 and uses.get(written[0].source.data, 0) == 1:
                try:
                    sch.compute_inline(block)
                    continue
                except Exception:  # noqa: BLE001 - not inlinable: compute it once instead
                    pass
            kept.append(block)
        if kind == "cuda":
            fused = sch.fuse(*sch.get_loops(out))
            anchor, inner = sch.split(fused, factors=[None, max_threads_per_block(target)])
            sch.bind(anchor, "blockIdx.x")
            sch.bind(inner, "threadIdx.x")
            anchor = inner
        else:
            anchor = self._cpu_anchor(sch, out)
        if anchor is None:
            return None
        for block in kept:  # consumers first, so every consumer is already under the anchor loop
            sch.compute_at(block, anchor, preserve_unit_loops=True)
            sch.set_scope(block, 0, "local")
        return sch

    @staticmethod
    def _cpu_anchor(sch: s_tir.Schedule, out):
        """The parallel loop over chunks: whole innermost axes (>= CPU_MIN_CHUNK elements when the shape
        allows), the last one split beyond CPU_MAX_CHUNK. A chunk must be a box: one spanning parts of two
        rows would make every stage's region the whole rows."""
        loops = list(sch.get_loops(out))
        extents = [sch.get(lp).extent for lp in loops]
        if not all(isinstance(e, tvm.tirx.IntImm) for e in extents):
            return None
        sizes = [e.value for e in extents]
        if sizes[-1] > CPU_MAX_CHUNK:
            last_o, _ = sch.split(loops[-1], factors=[None, CPU_MAX_CHUNK])
            loops, sizes = loops[:-1] + [last_o], sizes[:-1] + [1]
        inner, chunk = len(loops), 1
        while inner > 0 and chunk < CPU_MIN_CHUNK and chunk * sizes[inner - 1] <= CPU_MAX_CHUNK:
            inner -= 1
            chunk *= sizes[inner]
        if inner == 0:
            return None  # one chunk holds everything: nothing to run in parallel
        anchor = sch.fuse(*loops[:inner]) if inner > 1 else loops[0]
        sch.parallel(anchor)
        return anchor

    def is_target_available(self, target) -> bool:
        return target.kind.name in ("cuda", "llvm")


def cpu_schedules() -> tvm.transform.Pass:
    """The elementwise-chain rule for llvm (other functions keep TVM's default lowering)."""
    return dl.ApplyDefaultSchedule(ElementwiseChain())
