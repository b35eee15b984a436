"""Fused TIR kernels for the private ``ai.ivit`` ops, reached through TVM's relax ONNX frontend.

Instead of inlining the ops' int64 function bodies (long elementwise chains: ~120 CUDA kernels for
DeiT-Tiny, 64-bit divisions per element), ``prepare_for_tvm(keep_ops=KERNEL_OPS)`` leaves the private
nodes in place and :func:`.frontend.ivit_converters` gives the frontend a converter per op:

- Requantize, IAdd, ShiftGELU, IBertGELU (:mod:`.elementwise`): one injective ``te.compute`` each, fused by
  Relax into the producing GEMM's epilogue or the neighbouring elementwise ops;
- Shiftmax, ILayerNorm, L1LayerNorm, IL2Norm (:mod:`.rows`): one opaque kernel each (a thread block per row
  on cuda, parallel rows on llvm), scheduled by :func:`.frontend.schedule_row_kernels` right after fusion.

Converters also take a producer into its consumer's kernel where that saves an int32 tensor in memory or a
launch (:class:`.frontend._Import`: Shiftmax reads its widening Requantize's input, P·V is a uint8 GEMM
whose zero-point term uses the row sums the Shiftmax kernel also writes; :mod:`.layout`: the patch
embedding's epilogue moves to its GEMM, Split and constant-index Gather become slices that
:mod:`..prologue` moves into the GEMMs reading them), and per-op constants travel as data (Shiftmax's
``x0``, ShiftGELU's table start), so ops that differ only in them share one kernel.

Every kernel equals the numpy reference (``opset/<op>.py``) bit for bit on the inputs the opset allows;
:mod:`.arith` holds the shared integer primitives.
"""

from __future__ import annotations

from .frontend import ivit_converters, restore_injective, schedule_row_kernels

#: the private ops that have kernels here (all of them)
KERNEL_OPS = ("Requantize", "IAdd", "ShiftGELU", "Shiftmax", "ILayerNorm", "IBertGELU", "L1LayerNorm",
              "IBertSoftmax", "LogIntSoftmax", "IL2Norm")

__all__ = ["KERNEL_OPS", "ivit_converters", "restore_injective", "schedule_row_kernels"]
