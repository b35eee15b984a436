"""A ViT whose LayerNorms are hand-written (ReduceMean/Sub/Pow/ReduceMean/Add/Sqrt/Div, as ViT-S's author
exported them), quantized by onnxruntime's ``quantize_static`` in three recipes, with and without
``quant_pre_process``: every variant converts strictly with its LayerNorms fused, and follows the fake-quant
model (the house bounds of models/hf_matrix.py, on digits test inputs with margins). The patch norm reduces
over the channels of [B, C, N] tokens before their Transpose: the form ``quant_pre_process`` leaves when it
pushes a Transpose through a LayerNorm, which it cannot fuse itself (it fuses the others)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("onnxruntime.quantization")

from ivit_onnx import rewrite  # noqa: E402
from ivit_onnx.certify import float_offenders  # noqa: E402
from ivit_onnx.models.hf_matrix import LEARNED, MIN_AGREEMENT, MIN_COSINE, MIN_INPUTS, margins  # noqa: E402
from ivit_onnx.models.runtime import cosine, ort_session  # noqa: E402

DEPTH = 2
LAYERNORMS = 2 * DEPTH + 2  # the patch norm, norm1 and norm2 per block, the final norm
EPOCHS = 15
FAST = [("int8_sym", True), ("uint8_asym", False)]
SLOW = [("default", True), ("default", False), ("int8_sym", False), ("uint8_asym", True)]


class HandLayerNorm(torch.nn.Module):
    """LayerNorm over ``axis`` as people write it by hand (eps inside the square root); trains through
    ``F.layer_norm`` (the same function, faster) until ``hand`` is set for the export."""

    def __init__(self, dim: int, eps: float = 1e-6, axis: int = -1):
        super().__init__()
        self.weight, self.bias = torch.nn.Parameter(torch.ones(dim)), torch.nn.Parameter(torch.zeros(dim))
        self.eps, self.axis, self.hand = eps, axis, False

    def forward(self, x):
        if not self.hand:
            y = torch.nn.functional.layer_norm(
                x.movedim(self.axis, -1), x.shape[self.axis :][:1], self.weight, self.bias, self.eps
            )
            return y.movedim(-1, self.axis)
        shape = [-1] + [1] * (-1 - self.axis)  # gamma/beta broadcast along the normalized axis
        g, b = self.weight.reshape(shape), self.bias.reshape(shape)
        mean = x.mean(self.axis, keepdim=True)
        var = ((x - mean) ** 2).mean(self.axis, keepdim=True)
        return (x - x.mean(self.axis, keepdim=True)) / torch.sqrt(var + self.eps) * g + b


class NormedPatches(torch.nn.Module):
    """Patch embedding with a LayerNorm over the channels of the [B, C, N] tokens before they are transposed
    (the form ``quant_pre_process`` leaves when it pushes the Transpose through a LayerNorm)."""

    def __init__(self, patch_embed, dim: int):
        super().__init__()
        self.proj, self.num_patches = patch_embed.proj, patch_embed.num_patches
        self.norm = HandLayerNorm(dim, axis=-2)

    def forward(self, x):
        return self.norm(self.proj(x).flatten(2)).transpose(1, 2)


def _hand_written(model: torch.nn.Module) -> torch.nn.Module:
    for name, child in model.named_children():
        if isinstance(child, torch.nn.LayerNorm):
            setattr(model, name, HandLayerNorm(child.normalized_shape[0], child.eps))
        else:
            _hand_written(child)
    return model


@pytest.fixture(scope="module")
def trained(tmp_path_factory, digits):
    """The FP32 ONNX path of a 2-block ViT (hidden 32) with hand-written LayerNorms, trained briefly on
    digits, exported by the TorchScript exporter at opset 17."""
    from ivit_onnx.models.export import export_onnx
    from ivit_onnx.models.vit import vit

    torch.manual_seed(0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: threads only add overhead
    model = _hand_written(vit(8, 2, 1, 10, embed_dim=32, depth=DEPTH, num_heads=2, mlp_ratio=2.0))
    model.patch_embed = NormedPatches(model.patch_embed, 32)
    x, y = torch.from_numpy(digits[0]), torch.from_numpy(digits[1])
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    steps = -(-len(x) // 32)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, 6e-3, total_steps=EPOCHS * steps)
    gen = torch.Generator().manual_seed(0)
    for _ in range(EPOCHS):
        for idx in torch.randperm(len(x), generator=gen).split(32):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x[idx]), y[idx]).backward()
            opt.step()
            sched.step()
    torch.set_num_threads(threads)
    for m in model.modules():
        if isinstance(m, HandLayerNorm):
            m.hand = True
    model.eval()
    with torch.no_grad():  # it learned (chance is 10 %; hf_matrix.LEARNED)
        assert (model(torch.from_numpy(digits[2])).argmax(1).numpy() == digits[3]).mean() >= LEARNED
    path = tmp_path_factory.mktemp("decomposed_ln") / "fp32.onnx"
    export_onnx(model.eval(), x[:2], path, "torchscript", opset=17)
    return path


def _check(trained, digits, tmp_path, variant, preprocess):
    from ivit_onnx.models.ort_qdq import ort_quantize

    x_test = digits[2]
    fq_path = tmp_path / f"{variant}_{preprocess}.onnx"
    calib = [digits[0][i : i + 64] for i in range(0, 256, 64)]
    fq_model = ort_quantize(trained, fq_path, calib, variant=variant, preprocess=preprocess)
    model, report = rewrite(str(fq_path))
    # quant_pre_process fuses the last-axis ones itself; the channels-first patch norm is always left to us
    by_ort = sum(n.op_type == "LayerNormalization" for n in fq_model.graph.node)
    ours = report.counts["fuse_layernorm"]["LayerNorm (decomposed)"]
    assert ours + by_ort == LAYERNORMS and ours >= (1 if preprocess else LAYERNORMS)
    assert sum(n.op_type == "ILayerNorm" for n in model.graph.node) == LAYERNORMS
    assert float_offenders(model) == []
    fq = ort_session(fq_path).run(None, {"input": x_test})[0]
    integer = ort_session(model).run(None, {"input": x_test})[0]
    keep = margins(fq)
    assert keep.sum() >= MIN_INPUTS
    agreement = float(np.mean(fq[keep].argmax(1) == integer[keep].argmax(1))) * 100
    assert cosine(fq[keep], integer[keep]) >= MIN_COSINE and agreement >= MIN_AGREEMENT


@pytest.mark.parametrize("variant, preprocess", FAST)
def test_converts_strictly(trained, digits, tmp_path, variant, preprocess):
    _check(trained, digits, tmp_path, variant, preprocess)


@pytest.mark.slow
@pytest.mark.parametrize("variant, preprocess", SLOW)
def test_converts_strictly_slow(trained, digits, tmp_path, variant, preprocess):
    _check(trained, digits, tmp_path, variant, preprocess)
