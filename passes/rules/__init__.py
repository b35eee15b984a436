"""Per-op lowering rules of ``lower_integer``: one explicit list, each a :class:`~..pattern.Rule` (nothing
self-registers); ``RULES`` maps every op type a rule's pattern names to that rule."""

from __future__ import annotations

from . import (
    batchnorm,
    chain,
    compare,
    conv_transpose,
    elementwise,
    l2norm,
    layout,
    linear,
    lookup,
    mask,
    masked_pool,
    nan_guard,
    nonlinear,
    pad,
    pool,
    product,
    qdq,
    resize,
    select,
    token_mask,
    unary,
)
from .lowerer import Lowerer, Outcome

LOWERING = (
    qdq.Quantize(),
    qdq.Dequantize(),
    chain.FirstOf(qdq.Clip(), unary.FloatClip()),  # #27: QCDQ's integer Clip, else a float Clip's clamp
    unary.PiecewiseLinear(),  # #27: Relu / Neg / Abs / LeakyRelu
    linear.MatMul(),
    linear.Gemm(),
    linear.Conv(),
    conv_transpose.ConvTranspose(),  # #28 (dense-prediction heads)
    elementwise.Add(),
    product.Product(),  # #27: positive constants fold (ScaleByConst), any other product is exact int32
    nonlinear.Softmax(),
    nonlinear.Gelu(),
    nonlinear.LayerNorm(),
    layout.Concat(),
    layout.Shape(),
    layout.Cast(),
    layout.PassThrough(),
    pool.ReduceMeanRule(),  # #11 (Swin)
    pad.PadRule(),  # #11 (Swin)
    batchnorm.BatchNorm(),  # #27 (LeViT, BatchNorm after a Conv or Linear)
    select.OrderSelection(),  # #27 (ReduceMax/Min, GlobalMaxPool, TopK)
    resize.Resize(),  # #27 (nearest; linear/cubic with dyadic weights)
    select.Scatter(),  # #27 (ScatterND, ScatterElements)
    pool.AveragePoolRule(),  # #27
    lookup.TableLookup(),  # #22 (BERT's pooler Tanh)
    l2norm.L2Norm(),  # #27 (Swinv2's cosine attention, F.normalize)
    compare.ArgExtreme(),  # #27 (ArgMax / ArgMin)
    compare.Compare(),  # #27 (Equal / Greater / Less ... of a quantized tensor)
)
RULES = {op: rule for rule in LOWERING for op in rule.pattern.ops}
# Tried before the table's rule for their op: token masks (two-valued floats of the int64 mask input),
# masked mean pooling, constant attention masks before Softmax, SDPA's NaN guard.
RULES = chain.ahead(RULES, (*token_mask.RULES, *masked_pool.RULES, mask.MaskedAdd(), *nan_guard.RULES))

__all__ = ["LOWERING", "RULES", "Lowerer", "Outcome"]
