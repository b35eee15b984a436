"""Constant attention masks before Softmax (passes/rules/mask.py, Swin's shifted windows): ``MaskedAdd``
lowers ``Softmax(Add(scores, C))`` to an integer Where whose masked entries come out exactly 0, also when
the sum is quantized first; every reason it declines (the generic Add, its fallback, taken out to see them).
The fill's proof against the Shiftmax reference and ``_mask_reason`` itself: tests/e2e/test_swin_mask.py."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from ivit_onnx.passes.rules import RULES, chain, mask
from tests.graphs import G, op_counts, run
from tests.passes._rules import RNG, declines, lowered

MASKED = np.array([[0, 1, 1, 0], [0, 0, 0, 1], [1, 0, 0, 0], [0, 0, 1, 0]], bool)
SCORES = {"s": (RNG.integers(-127, 128, (2, 1, 4, 4)) * 0.05).astype(np.float32)}


def _graph(c=None, scale=0.05, sum_q=None, softmax=True, reshape=False):
    """``Q(Softmax(DQ(Q(scores)) + C))`` with C ``-100`` where ``MASKED`` (or ``c``; "scores": the scores
    twice); ``sum_q`` quantizes the
    sum first (scale, zero point); ``reshape`` puts a row-keeping Reshape before the Softmax."""
    g = G()
    c = np.where(MASKED, -100.0, 0.0)[None, None] if c is None else c
    scores = g.qdq(g.input("s", [2, 1, 4, 4]), scale)
    y = g.node("Add", [scores, scores if isinstance(c, str) else g.const(c)])
    y = g.qdq(y, *sum_q) if sum_q else y
    y = g.node("Reshape", [y, g.const([2, 4, 4], np.int64)]) if reshape else y
    y = g.node("Softmax", [y], axis=-1) if softmax else y
    g.output(g.qdq(y, 1 / 256, 0, np.uint8))
    return g.model()


@pytest.mark.parametrize("sum_q, reshape", [(None, False), (None, True), ((0.5, 0), False)])
def test_masked_entries_are_exactly_zero(sum_q, reshape):
    fq = _graph(sum_q=sum_q, reshape=reshape)
    out, report = lowered(fq, SCORES, 6 / 256)  # Shiftmax vs softmax: <= 2.8 steps of 2**-7 (opset README)
    assert report.counts["lower_integer"]["attention mask (Where)"] == 1 and op_counts(out).get("Where") == 1
    got = run(out, SCORES)[0].reshape(2, 4, 4)
    assert np.all(got[:, MASKED] == 0) and np.all(run(fq, SCORES)[0].reshape(2, 4, 4)[:, MASKED] == 0)


ROW = np.zeros((1, 1, 4, 4))
CASES = {
    "two_scores": ("not integer scores plus a constant", {"c": "scores"}),
    "no_softmax": ("the sum does not reach a last-axis Softmax through reshapes", {"softmax": False}),
    "wide": ("leaves no int32 room to mask", {"scale": 1e-9}),
    "no_masked_entry": ("(not a mask)", {"c": ROW - 0.25}),  # all zeros: fold_constants drops the Add
    "between": ("neither masked nor unmasked", {"c": np.where(MASKED, -100.0, 0.5)[None, None]}),
    "whole_rows": (
        "mask broadcast along the softmax axis would mask whole rows",
        {"c": np.full((4, 1), -100.0)},
    ),
    "full_row": ("a row is masked entirely", {"c": np.where(np.arange(4)[:, None] == 1, -100.0, ROW)}),
    "no_room": ("has no room below the scores for a mask fill", {"sum_q": (0.05, 0)}),
}


@pytest.mark.parametrize("case", CASES)
def test_declines_with_the_reason(case, monkeypatch):
    reason, kw = CASES[case]
    fq = _graph(**kw)
    monkeypatch.setitem(RULES, "Add", chain.FirstOf(mask.MaskedAdd()))
    declines(fq, "Add", reason)


@pytest.mark.parametrize("softmax", ["ibert", "lis"])
@pytest.mark.parametrize("sum_q, scale", [(None, 0.05), ((0.5, 0), 0.05), (None, 1e-5)])
def test_masked_entries_are_exactly_zero_with_polynomial_exps(softmax, sum_q, scale):
    """``--softmax ibert|lis``: the same Where, and their kernels give the masked entries exactly 0 too (with
    an upscaled grid, a quantized sum, and a fine scale whose grid is shifted down)."""
    fq = _graph(sum_q=sum_q, scale=scale)
    feeds = {"s": SCORES["s"] * np.float32(scale / 0.05)}
    atol = 6 / 256 if softmax == "ibert" else 0.34  # LIS: a level 2**-q differs from p by up to p/2
    out, report = lowered(fq, feeds, atol, softmax=softmax)
    ops = op_counts(out)
    assert report.counts["lower_integer"]["attention mask (Where)"] == 1 and ops.get("Where") == 1
    kernel = "ai.ivit:" + ("IBertSoftmax" if softmax == "ibert" else "LogIntSoftmax")
    assert ops.get(kernel) == 1 and "ai.ivit:Shiftmax" not in ops
    (grid,) = [n for n in out.graph.node if n.op_type == "Requantize" and "exp_grid" in n.name]
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in out.graph.initializer}
    shift = inits[grid.input[3]].item()
    assert shift > 0 if scale < 1e-3 else shift == 0  # shifted down / upscaled exactly
    got = run(out, feeds)[0].reshape(2, 4, 4)
    assert np.all(got[:, MASKED] == 0) and np.all(run(fq, feeds)[0].reshape(2, 4, 4)[:, MASKED] == 0)


# Attention masks computed from the int64 mask input in the forms that used to slip past the quantized-mask
# refusal (DeBERTa-v2's Where with the fill as an operand; a Q/DQ'd ``(1 - mask) * finfo.min``), and the
# unquantized Where form, which converts like the additive mask (passes/rules/token_mask.py).
FILL = float(np.finfo(np.float32).min)
#: the fill constant's Q/DQ scale: exact (int8 -128 dequantizes to FILL), or quantize_static's symmetric int8
#: (-127 at |FILL| / 127, which dequantizes past float32's range: -inf)
FILL_SCALES = {"exact": -FILL / 128, "int8_sym": -FILL / 127}
TOKENS = {"s": SCORES["s"], "mask": np.array([[1, 1, 0, 0], [1, 0, 1, 0]], np.int64)}


def _mask_graph(form: str, quantized: bool, fill_qdq: str | None = None):
    """``Softmax`` of the scores masked by the int64 ``mask``: "where" ``Where(Not(bool(mask)), fill, S)``,
    "where_swapped" ``Where(bool(mask), S, fill)``, "where_2d" the first with DeBERTa-v2's query-by-key mask
    ``mask[:, None, :, None] * mask[:, None, None, :]``, "product" ``S + (1 - float(mask)) * fill``.
    ``quantized``: the masked scores (and the product) get Q/DQ pairs whose scales cover the fill
    (``quantize_static`` without the mask recipe); ``fill_qdq``: the fill constant too, Q → DQ at one of
    ``FILL_SCALES``."""
    g = G()
    scores = g.qdq(g.input("s", [2, 1, 4, 4]), 0.05)
    mask = g.input("mask", [2, 4], onnx.TensorProto.INT64)
    mask = g.node("Reshape", [mask, g.const([2, 1, 1, 4], np.int64)])
    fill = g.const(FILL)
    if fill_qdq:
        fill = g.qdq(fill, FILL_SCALES[fill_qdq])
    if form == "product":
        m = g.node("Sub", [g.const(1.0), g.node("Cast", [mask], to=onnx.TensorProto.FLOAT)])
        m = g.node("Mul", [m, fill])
        m = g.qdq(m, FILL_SCALES["exact"]) if quantized else m
        y = g.node("Add", [scores, m])
    else:
        if form == "where_2d":  # DeBERTa-v2: the query-by-key product of the padding mask
            rows = g.node("Squeeze", [mask, g.const([2], np.int64)])
            mask = g.node("Mul", [mask, g.node("Unsqueeze", [rows, g.const([3], np.int64)])])
        cond = g.node("Cast", [mask], to=onnx.TensorProto.BOOL)
        swapped = form == "where_swapped"
        y = g.node("Where", [cond, scores, fill] if swapped else [g.node("Not", [cond]), fill, scores])
    y = g.qdq(y, -FILL / 255, 127, np.uint8) if quantized else y
    g.output(g.qdq(g.node("Softmax", [y], axis=-1), 1 / 256, 0, np.uint8))
    return g.model()


@pytest.mark.filterwarnings("ignore:overflow encountered in cast")  # the -inf fill of "int8_sym"
@pytest.mark.parametrize("form", ["where", "where_2d", "product"])
@pytest.mark.parametrize("fill_qdq", [None, "exact", "int8_sym"])
def test_quantized_mask_forms_get_the_mask_refusal(form, fill_qdq):
    """One line naming the quantized tensor, its fill value and the recipe (models/hf_matrix.MASK_REFUSAL),
    instead of the Softmax's ``x0 and row length must be >= 1``."""
    import re

    from ivit_onnx import ConversionError, rewrite
    from ivit_onnx.models.hf_matrix import MASK_REFUSAL

    fq = _mask_graph(form, quantized=True, fill_qdq=fill_qdq)
    with pytest.raises(ConversionError) as e:
        rewrite(fq)
    msg = str(e.value)
    assert "\n" not in msg and all(re.search(p, msg) for p in MASK_REFUSAL), msg
    masked = next(n for n in fq.graph.node if n.op_type == ("Where" if form != "product" else "Add"))
    fill = "-inf" if fill_qdq == "int8_sym" else f"{FILL:.3g}"
    assert f"tensor '{masked.output[0]}'" in msg and f"fill value {fill}" in msg, msg


@pytest.mark.parametrize("form", ["where", "where_swapped", "where_2d"])
def test_unquantized_where_mask_converts(form):
    """DeBERTa-v2's ``Where(Not(mask), finfo.min, scores)`` left float by the mask recipe: the integer Where
    of the additive mask, masked probabilities exactly 0 as in the fake-quant graph (the query-by-key mask's
    padded query rows are masked whole: uniform in both)."""
    fq = _mask_graph(form, quantized=False)
    out, report = lowered(fq, TOKENS, 6 / 256)  # Shiftmax vs softmax: <= 2.8 steps of 2**-7 (opset README)
    assert report.counts["lower_integer"]["attention mask (Where)"] == 1
    assert "Softmax" not in op_counts(out) and "Not" not in op_counts(out)
    m = TOKENS["mask"]
    masked = (m[:, None, None, :] == 0) & ((m[:, None, :, None] == 1) if form == "where_2d" else True)
    masked = np.broadcast_to(masked, (2, 1, 4, 4))
    assert np.all(run(out, TOKENS)[0][masked] == 0) and np.all(run(fq, TOKENS)[0][masked] == 0)


def test_where_fill_too_high_declines():
    """A Where "fill" that the softmax does not round to 0 is no mask: declined with the reason."""
    fq = _mask_graph("where", quantized=False)
    for init in fq.graph.initializer:
        if init.data_type == onnx.TensorProto.FLOAT and onnx.numpy_helper.to_array(init).item(0) == FILL:
            init.CopyFrom(onnx.numpy_helper.from_array(np.array(-1.0, np.float32), init.name))
    declines(fq, "Where", "fill value -1 does not mask the softmax")
