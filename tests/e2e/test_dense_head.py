"""A dense-prediction (saliency) head behind a ViT backbone converts strictly end to end: the trained digits
ViT's patch tokens as a feature map, ConvTranspose, BatchNormalization, Relu, a 1x1 Conv, bilinear Resize
and Sigmoid, quantized by onnxruntime's ``quantize_static``; integer-only, every MAC integer, and within
cosine 0.99 of the fake-quant model (centred on the Sigmoid's midpoint, so that agreeing signs count, not
the positive outputs' common direction)."""

from __future__ import annotations

import numpy as np
import pytest

from ivit_onnx import rewrite
from ivit_onnx.certify import float_offenders
from tests.e2e.conftest import torch
from tests.graphs import op_counts

MIN_COSINE = 0.99
#: the fixture's FP32 model must find the digits' strokes (else the test converts noise)
MIN_PIXEL_ACCURACY = 0.9


class SaliencyHead(torch.nn.Module):
    """Patch tokens → ``[N, D, h, w]`` → ConvTranspose (x2) → BatchNorm → ReLU → 1x1 Conv → bilinear x2 →
    Sigmoid: a ViT segmentation head's layers (the upsampling ConvTranspose as ``kernel``/``stride``/
    ``pads``/``output_padding`` give)."""

    def __init__(self, backbone, grid: int, out_chans: int = 16, align_corners: bool = False, **deconv):
        super().__init__()
        self.backbone, self.grid, self.align_corners = backbone, grid, align_corners
        dim = backbone.cls_token.shape[-1]
        self.up = torch.nn.ConvTranspose2d(dim, out_chans, **(deconv or dict(kernel_size=2, stride=2)))
        self.bn = torch.nn.BatchNorm2d(out_chans)
        self.out = torch.nn.Conv2d(out_chans, 1, 1)

    def decode(self, tokens):
        n, _, d = tokens.shape
        x = tokens[:, 1:].transpose(1, 2).reshape(n, d, self.grid, self.grid)
        x = self.out(torch.relu(self.bn(self.up(x))))
        up = torch.nn.functional.interpolate
        return torch.sigmoid(up(x, scale_factor=2, mode="bilinear", align_corners=self.align_corners))

    def forward(self, x):
        return self.decode(self.backbone.forward_features(x))


def _target(x):
    """The strokes: pixels above a quarter of full scale, at the head's output resolution (x2)."""
    return (x > 0.25).float().repeat_interleave(2, 2).repeat_interleave(2, 3)


def _trained(backbone, digits, **head):
    """The head trained briefly on frozen backbone features (BatchNorm statistics included)."""
    torch.manual_seed(0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors: threads only add overhead (7x here)
    model = SaliencyHead(backbone, grid=4, **head)
    x = torch.from_numpy(digits[0])
    with torch.no_grad():
        feats = backbone.eval().forward_features(x)
    params = [*model.up.parameters(), *model.bn.parameters(), *model.out.parameters()]
    opt = torch.optim.Adam(params, lr=1e-2)
    gen, y = torch.Generator().manual_seed(0), _target(x)
    model.train()
    for _ in range(3):
        for idx in torch.randperm(len(x), generator=gen).split(64):
            opt.zero_grad()
            torch.nn.functional.binary_cross_entropy(model.decode(feats[idx]), y[idx]).backward()
            opt.step()
    torch.set_num_threads(threads)
    model.eval()
    with torch.no_grad():
        xt = torch.from_numpy(digits[2])
        acc = float(((model(xt) > 0.5).float() == _target(xt)).float().mean())
    assert acc >= MIN_PIXEL_ACCURACY, acc
    return model


@pytest.fixture(scope="module")
def saliency_fp32(tmp_path_factory, digits_torch, digits):
    from ivit_onnx.models.export import export_onnx

    path = tmp_path_factory.mktemp("dense_head") / "fp32.onnx"
    example = torch.from_numpy(digits[2][:2])
    export_onnx(_trained(digits_torch, digits), example, path, "torchscript", opset=17)
    return path


def _centred_cosine(a, b):
    a, b = (a - 0.5).reshape(len(a), -1), (b - 0.5).reshape(len(b), -1)
    return float(np.min(np.sum(a * b, 1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))))


def _check(fp32_path, digits, tmp_path, variant, preprocess):
    from ivit_onnx.models.ort_qdq import ort_quantize
    from ivit_onnx.models.runtime import ort_session

    fq_path = tmp_path / f"{variant}_{preprocess}.onnx"
    fq_model = ort_quantize(fp32_path, fq_path, [digits[0][i : i + 64] for i in range(0, 256, 64)], variant,
                            preprocess=preprocess)
    ops = {n.op_type for n in fq_model.graph.node}
    # the head as quantized (quant_pre_process folds the BatchNorm into the ConvTranspose; asymmetric
    # activations drop the Relu into the QuantizeLinear)
    assert {"ConvTranspose", "Resize", "Sigmoid"} <= ops, ops
    model, report = rewrite(str(fq_path))
    assert float_offenders(model) == []
    assert report.notes["integer_mac_percent"] == 100.0
    assert "ConvTranspose" not in op_counts(model)
    x = digits[2][:32]
    fq, integer = (ort_session(m).run(None, {"input": x})[0] for m in (fq_path, model))
    assert integer.shape == fq.shape == (32, 1, 16, 16)
    assert _centred_cosine(fq, integer) >= MIN_COSINE
    return report, ops


def test_saliency_head_converts_strictly(saliency_fp32, digits, tmp_path):
    """Symmetric int8 without quant_pre_process keeps every layer of the head."""
    report, ops = _check(saliency_fp32, digits, tmp_path, "int8_sym", preprocess=False)
    assert {"BatchNormalization", "Relu"} <= ops, ops
    counts = report.counts["lower_integer"]
    assert counts["ConvTranspose as MatMulInteger (blockwise)"] == 1
    assert counts["Resize (linear) as int32 MatMuls"] == 1


@pytest.mark.slow
@pytest.mark.parametrize(
    "variant, preprocess",
    [("int8_sym", True), ("uint8_asym", True), ("uint8_asym", False), ("default", True)],
)
def test_saliency_head_variants(saliency_fp32, digits, tmp_path, variant, preprocess):
    _check(saliency_fp32, digits, tmp_path, variant, preprocess)


@pytest.mark.slow
@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_saliency_head_with_an_overlapping_deconvolution(digits_torch, digits, tmp_path, exporter):
    """kernel 3, stride 2, pad 1, output padding 1 (four blocks, shifted and summed), and DPT's
    ``align_corners`` upsampling (weights in fifteenths), from either exporter."""
    from ivit_onnx.models.export import export_onnx

    deconv = dict(kernel_size=3, stride=2, padding=1, output_padding=1)
    model = _trained(digits_torch, digits, align_corners=True, **deconv)
    opset = 18 if exporter == "dynamo" else 17
    export_onnx(model, torch.from_numpy(digits[2][:2]), tmp_path / "fp32.onnx", exporter, opset=opset)
    report, _ = _check(tmp_path / "fp32.onnx", digits, tmp_path, "uint8_asym", preprocess=True)
    assert report.counts["lower_integer"]["ConvTranspose as MatMulInteger (blockwise)"] == 1
