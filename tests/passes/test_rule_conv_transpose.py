"""ConvTranspose (passes/rules/conv_transpose.py): within one output step of the fake-quant graph, integer
only, the same bits on every backend, the MAC count, and every reason to decline."""

from __future__ import annotations

import numpy as np
import pytest

from tests.graphs import G, op_counts, run
from tests.passes._rules import RNG, backends_agree, declines, lowered

OUT_SCALE = 0.05


def _graph(cin, cout_g, spatial, kernel, axis=1, bias=True, x_dtype=np.uint8, batch=2, out_q=True,
           symbolic=None, **attrs):
    """``x`` (QDQ'd; its batch named ``symbolic`` if given) → ConvTranspose with a quantized weight (per
    channel on ``axis``, None: per tensor) and a float bias → QDQ (unless not ``out_q``); returns the model
    and a feed."""
    g, groups = G(), attrs.get("group", 1)
    zp = 7 if x_dtype == np.uint8 else 0
    x = g.qdq(g.input("x", [batch if symbolic is None else symbolic, cin, *spatial]), 0.02, zp, x_dtype)
    wv = RNG.standard_normal((cin, cout_g, *kernel)) * 0.3
    if axis is None:  # per tensor, uint8 with a zero point (MatMulInteger/ConvInteger take it as an input)
        s = float(np.abs(wv).max()) / 127
        q = g.const(np.rint(wv / s) + 128, np.uint8)
        w = g.node("DequantizeLinear", [q, g.const(s), g.const(128, np.uint8)])
    else:
        w = g.weight(wv, axis=axis)
    inputs = [x, w] + ([g.const(RNG.standard_normal(cout_g * groups) * 0.1)] if bias else [])
    y = g.node("ConvTranspose", inputs, kernel_shape=list(kernel), **attrs)
    g.output(g.qdq(y, OUT_SCALE) if out_q else y)
    feed = {"x": (RNG.standard_normal((batch, cin, *spatial)) * 0.8).astype(np.float32)}
    return g.model(), feed


CASES = {
    # the segmentation head's 2x2 stride-2 upsampling: one MatMulInteger + depth-to-space
    "k2_s2": (dict(cin=4, cout_g=3, spatial=[5, 6], kernel=[2, 2], strides=[2, 2]), "blockwise"),
    "k2_s2_pads_per_tensor": (
        dict(cin=4, cout_g=3, spatial=[5, 6], kernel=[2, 2], strides=[2, 2], pads=[1, 0, 0, 1], axis=None),
        "blockwise",
    ),
    # kernel > stride: blocks of one stride, shifted and summed
    "k3_s2_p1_op1": (
        dict(cin=4, cout_g=3, spatial=[5, 4], kernel=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1],
             output_padding=[1, 1]),
        "blockwise",
    ),
    "k3_s2_p1_op1_per_tensor": (  # the kernel padded with the uint8 weight's zero point
        dict(cin=4, cout_g=3, spatial=[5, 4], kernel=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1],
             output_padding=[1, 1], axis=None),
        "blockwise",
    ),
    "pads_past_reach_int8": (
        dict(cin=4, cout_g=3, spatial=[6, 7], kernel=[3, 2], strides=[2, 3], pads=[3, 1, 2, 2],
             output_padding=[1, 2], x_dtype=np.int8, bias=False),
        "blockwise",
    ),
    "k5_s2_op1_1d": (
        dict(cin=3, cout_g=4, spatial=[7], kernel=[5], strides=[2], pads=[2, 1], output_padding=[1]),
        "blockwise",
    ),
    "blockwise_3d": (
        dict(cin=2, cout_g=3, spatial=[3, 4, 2], kernel=[3, 2, 4], strides=[2, 2, 3],
             pads=[1, 0, 0, 0, 1, 1]),
        "blockwise",
    ),
    # even total padding: the two sides take half each, as the output ``input * stride`` needs
    "same_upper_k4_s2": (
        dict(cin=4, cout_g=3, spatial=[5, 6], kernel=[4, 4], strides=[2, 2], auto_pad="SAME_UPPER"),
        "blockwise",
    ),
    # groups, dilations, stride 1: the ConvInteger of the zero-inserted input
    "groups": (
        dict(cin=6, cout_g=2, spatial=[4, 5], kernel=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], group=3),
        "zero-inserted",
    ),
    "depthwise_axis0": (
        dict(cin=3, cout_g=2, spatial=[4, 4], kernel=[4, 4], strides=[2, 2], pads=[1, 1, 1, 1], group=3,
             axis=0),
        "zero-inserted",
    ),
    # pads past the kernel's reach crop the input; the end takes the output padding
    "groups_pads_past_reach_int8": (
        dict(cin=4, cout_g=3, spatial=[6, 7], kernel=[3, 2], strides=[2, 3], pads=[3, 1, 2, 2],
             output_padding=[1, 2], x_dtype=np.int8, bias=False, group=2),
        "zero-inserted",
    ),
    "dilated_1d": (
        dict(cin=3, cout_g=4, spatial=[9], kernel=[3], strides=[2], dilations=[2], pads=[1, 0]),
        "zero-inserted",
    ),
    "same_lower_k3_s1": (
        dict(cin=4, cout_g=3, spatial=[5, 6], kernel=[3, 3], auto_pad="SAME_LOWER", axis=None),
        "zero-inserted",
    ),
    "stride1_3d": (dict(cin=2, cout_g=3, spatial=[3, 4, 3], kernel=[2, 3, 2], pads=[0, 1, 1, 1, 0, 0]),
                   "zero-inserted"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_matches_fake_quant_on_every_backend(case):
    kw, path = CASES[case]
    fq, feed = _graph(**kw)
    out, report = lowered(fq, feed, OUT_SCALE + 1e-6)
    assert run(out, feed)[0].shape == run(fq, feed)[0].shape
    counts = report.counts["lower_integer"]
    assert [k for k in counts if k.startswith("ConvTranspose as")] == [
        next(k for k in ("ConvTranspose as MatMulInteger (blockwise)",
                         "ConvTranspose as ConvInteger (zero-inserted)") if path in k)
    ]
    assert ("ConvInteger" in op_counts(out)) == (path == "zero-inserted")
    assert counts.get("bias Add (int32)", 0) == int(kw.get("bias", True))
    # every input element meets C_out/group x kernel weights
    macs = 2 * kw["cin"] * np.prod(kw["spatial"]) * kw["cout_g"] * np.prod(kw["kernel"])
    assert report.notes["integer_macs"] == macs and report.notes["integer_mac_percent"] == 100.0
    backends_agree(out, feed)


@pytest.mark.parametrize("case", ["k2_s2", "k3_s2_p1_op1"])
def test_symbolic_batch(case):
    """Both forms reshape with the batch copied (0), so a symbolic batch stays symbolic."""
    fq, feed = _graph(**CASES[case][0], symbolic="N")
    out, _ = lowered(fq, feed, OUT_SCALE + 1e-6)
    assert out.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "N"
    four = np.concatenate([feed["x"], -feed["x"]])
    whole = run(out, {"x": four})[0]
    for batch in (1, 3):
        np.testing.assert_array_equal(run(out, {"x": four[:batch]})[0], whole[:batch])


def test_stride_one_needs_no_static_shape():
    """A stride-1 ConvTranspose (no zero points to insert) is a ConvInteger whatever the spatial shape."""
    g = G()
    x = g.qdq(g.input("x", [1, 4, "h", "w"]), 0.02, 0, np.int8)
    w = g.weight(RNG.standard_normal((4, 3, 1, 1)) * 0.3, axis=1)
    g.output(g.qdq(g.node("ConvTranspose", [x, w], kernel_shape=[1, 1]), OUT_SCALE))
    for shape in ((1, 4, 3, 5), (1, 4, 6, 2)):
        feed = {"x": RNG.standard_normal(shape).astype(np.float32)}
        out, _ = lowered(g.model(), feed, OUT_SCALE + 1e-6)
    assert op_counts(out).get("ConvInteger") == 1


@pytest.mark.parametrize("case", ["k2_s2", "k3_s2_p1_op1", "groups"])
def test_sums_are_exact(case):
    """With no output QuantizeLinear the dequantized int32 sums are the float ConvTranspose of the
    dequantized operands, to float rounding: the rule's only rounding is the output's."""
    kw = dict(CASES[case][0], bias=False, out_q=False)
    fq, feed = _graph(**kw)
    ref = run(fq, feed)[0]
    lowered(fq, feed, 1e-5 * float(np.max(np.abs(ref))))


def _decline(case):
    g = G()
    x = g.qdq(g.input("x", [1, 4, "h", 5] if case == "symbolic" else [1, 4, 5, 5]), 0.02, 0, np.int8)
    attrs = dict(kernel_shape=[3, 3], strides=[2, 2])
    w = g.weight(RNG.standard_normal((4, 2, 3, 3)) * 0.3, axis=1)
    if case == "auto_pad":
        attrs["auto_pad"] = "SAME_UPPER"
    elif case == "output_shape":
        attrs["output_shape"] = [10, 10]
    elif case == "int16":
        g = G(opset=21)
        x = g.qdq(g.input("x", [1, 4, 5, 5]), 1e-3, 0, np.int16)
        w = g.weight(RNG.standard_normal((4, 2, 3, 3)) * 0.3, axis=1)
    elif case in ("axis0", "axis2"):
        w = g.weight(RNG.standard_normal((4, 2, 3, 3)) * 0.3, axis=int(case[-1]))
    g.output(g.qdq(g.node("ConvTranspose", [x, w], **attrs), 0.05))
    return g.model()


@pytest.mark.parametrize(
    "case, reason",
    [
        ("auto_pad", "auto_pad SAME_UPPER with an odd or negative total padding [1, 1] (export pads)"),
        ("output_shape", "the output_shape attribute is not supported"),
        ("int16", "operands are not 8-bit, per-tensor input and weight (int16, int8)"),
        ("axis0", "weights quantized per input channel (axis 0) with several input channels per group"),
        ("axis2", "weights quantized per channel along axis 2 (only 1, the output channels, or 0)"),
        ("symbolic", "a strided ConvTranspose needs a static spatial input shape"),
    ],
)
def test_declines_with_the_reason(case, reason):
    declines(_decline(case), "ConvTranspose", reason)
