"""Run a patch-embedding ConvInteger (kernel == stride, no padding) as a MatMulInteger, exactly.

onnxruntime's ConvInteger does an im2col and a generic GEMM: DeiT's 16x16/16 patch embedding took 19 ms of
a 157 ms batch, 4x onnxruntime's float Conv. With non-overlapping patches the im2col is a reshape and a
transpose, so ``Reshape -> Transpose -> Reshape -> MatMulInteger -> Transpose -> Reshape`` computes the
same int32 sums (same products, same zero points) in onnxruntime's fast u8 GEMM, and hands the consumers
the same NCHW tensor. Applied at session time for the library backend, like :mod:`.u8_gemm`;
the converted model keeps its ConvInteger.
"""

from __future__ import annotations

import onnx

from ivit_onnx.conv_gemm import rewrite_conv_integer


def patch_gemm(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """A copy of ``model`` with every eligible ConvInteger rewritten; returns it and how many were.

    The rewrite is the one both engines share (:mod:`ivit_onnx.conv_gemm`), limited to patch embeddings
    with a scalar weight zero point."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    return out, rewrite_conv_integer(out, patches_only=True)


__all__ = ["patch_gemm"]
