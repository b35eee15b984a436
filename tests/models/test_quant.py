"""Fake quantization: the custom ops, weight and activation quantizers, options, closeness to float."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from ivit_onnx.models.layers import QuantPoint  # noqa: E402
from ivit_onnx.models.quant import (  # noqa: E402
    ActFakeQuant,
    QConv2d,
    QLinear,
    act_quantizers,
    fake_quant_per_channel,
    fake_quant_per_tensor,
    quantize,
)
from ivit_onnx.models.runtime import cosine  # noqa: E402

from .conftest import images  # noqa: E402


def test_per_tensor_op_matches_torch_fake_quantize():
    x = torch.randn(1000) * 3
    scale, zp = torch.tensor(0.05), torch.tensor(3, dtype=torch.int8)
    ours = fake_quant_per_tensor(x, scale, zp)
    ref = torch.fake_quantize_per_tensor_affine(x, 0.05, 3, -128, 127)
    # torch multiplies by 1/scale where ONNX (and we) divide: ties may round apart by one step
    assert (ours - ref).abs().max() <= 0.05 + 1e-6
    assert (ours == ref).float().mean() > 0.99
    assert ours.min() >= (-128 - 3) * 0.05 - 1e-6 and ours.max() <= (127 - 3) * 0.05 + 1e-6


def test_per_channel_op_and_rounding_half_to_even():
    x = torch.tensor([[0.5, 1.5, 2.5], [-0.5, -1.5, 300.0]])
    out = fake_quant_per_channel(x, torch.tensor([1.0, 2.0]), torch.zeros(2, dtype=torch.int8), 0)
    assert out.tolist() == [[0.0, 2.0, 2.0], [-0.0, -2.0, 254.0]]


def test_uint8_and_int16_ranges():
    x = torch.tensor([-1.0, 0.0, 1.0, 1000.0])
    assert fake_quant_per_tensor(x, torch.tensor(0.5), torch.tensor(0, dtype=torch.uint8)).tolist() == [
        0.0,
        0.0,
        1.0,
        127.5,
    ]
    out = fake_quant_per_tensor(x * 100, torch.tensor(1.0), torch.tensor(0, dtype=torch.int16))
    assert out.tolist() == [-100.0, 0.0, 100.0, 32767.0]


def test_straight_through_gradient():
    x = torch.randn(10, requires_grad=True)
    fake_quant_per_tensor(x, torch.tensor(0.1), torch.tensor(0, dtype=torch.int8)).sum().backward()
    assert torch.equal(x.grad, torch.ones(10))


def test_act_quantizer_calibration():
    sym = ActFakeQuant(torch.int8)
    sym(torch.tensor([-0.5, 2.54]))
    sym.freeze()
    assert sym.scale.item() == pytest.approx(2.54 / 127) and sym.zero_point.item() == 0
    asym = ActFakeQuant(torch.uint8)
    asym(torch.tensor([-1.0, 4.1]))
    asym.freeze()
    assert asym.scale.item() == pytest.approx(5.1 / 255) and asym.zero_point.item() == 50
    fixed = ActFakeQuant(torch.uint8, fixed_scale=1 / 256)
    assert not fixed.calibrating
    with pytest.raises(RuntimeError, match="no data"):
        ActFakeQuant(torch.int8).freeze()


def test_module_swap_keeps_parameter_names(tiny_vit, tiny_fq):
    float_keys = set(tiny_vit.state_dict())
    assert float_keys <= set(tiny_fq.state_dict())
    assert not any(
        isinstance(m, QuantPoint) and m.role in ("act", "residual", "prob", "scores", "qkv")
        for m in tiny_fq.modules()
    )
    assert isinstance(tiny_fq.patch_embed.proj, QConv2d)
    assert isinstance(tiny_fq.blocks[0].mlp.fc1, QLinear)


def test_weights_on_per_channel_int8_grid(tiny_fq):
    fc1 = tiny_fq.blocks[0].mlp.fc1
    w = fake_quant_per_channel(fc1.weight, fc1.w_scale, fc1.w_zero_point, 0)
    q = w / fc1.w_scale[:, None]
    assert torch.allclose(q, q.round(), atol=1e-4)
    assert q.abs().amax(dim=1).round().eq(127).all()  # each channel's largest weight maps to ±127


def test_default_quantizers(tiny_fq):
    qs = act_quantizers(tiny_fq)
    prob = qs["blocks.0.attn.q_prob"]
    assert prob.zero_point.dtype == torch.uint8 and prob.scale.item() == 1 / 256
    assert qs["blocks.0.q_res1"].zero_point.dtype == torch.int8
    assert "blocks.0.attn.q_qkv" in qs and "blocks.0.attn.q_q" not in qs
    assert "blocks.0.attn.q_scores" in qs
    assert all(q.zero_point.item() == 0 for q in qs.values())
    assert all(not q.calibrating for q in qs.values())


def test_options(tiny_vit, calib):
    fq = quantize(
        tiny_vit,
        calib,
        act_dtype="uint8",
        residual_bits=16,
        softmax_scale=1 / 128,
        quantize_scores=False,
        qkv="split",
    )
    qs = act_quantizers(fq)
    assert qs["blocks.1.q_res2"].zero_point.dtype == torch.int16
    assert qs["q_pos_add"].zero_point.dtype == torch.int16
    assert qs["blocks.0.mlp.q_act"].zero_point.dtype == torch.uint8
    assert qs["blocks.0.attn.q_prob"].scale.item() == 1 / 128
    assert {"blocks.0.attn.q_q", "blocks.0.attn.q_k", "blocks.0.attn.q_v"} <= set(qs)
    assert "blocks.0.attn.q_qkv" not in qs and "blocks.0.attn.q_scores" not in qs
    with pytest.raises(ValueError, match="act_dtype"):
        quantize(tiny_vit, calib, act_dtype="int4")
    with pytest.raises(ValueError, match="empty"):
        quantize(tiny_vit, [])


@pytest.mark.parametrize(
    "options, bound",
    # a random tiny model (fixed seed): 8-bit activations everywhere move its logits by a few percent
    [({}, 0.9), ({"residual_bits": 16}, 0.9), ({"act_dtype": "uint8"}, 0.9), ({"qkv": "split"}, 0.9)],
)
def test_fake_quant_close_to_float(tiny_vit, calib, x, options, bound):
    fq = quantize(tiny_vit, calib, **options)
    with torch.no_grad():
        assert cosine(fq(x), tiny_vit(x)) > bound
        assert fq(x).argmax(-1).eq(tiny_vit(x).argmax(-1)).float().mean() >= 0.75


def test_quantize_leaves_the_float_model_alone(tiny_vit, calib):
    before = {k: v.clone() for k, v in tiny_vit.state_dict().items()}
    quantize(tiny_vit, calib)
    assert all(torch.equal(before[k], v) for k, v in tiny_vit.state_dict().items())
    assert not act_quantizers(tiny_vit)
    x = images(2, 9)
    assert torch.equal(tiny_vit.q_input(x), x)
