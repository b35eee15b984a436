"""DeiT-shaped integer/FP32 ONNX pairs (random weights) for the TVM tests, built once per configuration."""

from __future__ import annotations

from pathlib import Path

#: head_dim 64 as in every DeiT (the attention GEMMs' K and N), 17 tokens, one block: cheap to compile
SMALL_DEIT = dict(img_size=32, patch_size=8, in_chans=3, num_classes=10, embed_dim=128, depth=1, num_heads=2)


def deit_pair(out: Path, batch: int = 2, name: str | None = None, **cfg) -> dict[str, Path]:
    """``{"fp32", "fq", "int"}`` ONNX files of ``models.vit.<name>()`` (e.g. ``deit_tiny_patch16_224``) or
    of ``models.vit.vit(**cfg)`` (default :data:`SMALL_DEIT`), calibrated on random images of ``batch``."""
    import torch

    from ivit_onnx import rewrite
    from ivit_onnx.models import vit
    from ivit_onnx.models.export import export_onnx
    from ivit_onnx.models.quant import quantize

    cfg = {**SMALL_DEIT, **cfg}
    paths = {k: out / f"{name or 'deit'}_{k}.onnx" for k in ("fp32", "fq", "int")}
    torch.manual_seed(0)
    model = (getattr(vit, name)() if name else vit.vit(**cfg)).eval()
    gen = torch.Generator().manual_seed(1)
    size = 224 if name else cfg["img_size"]  # every named DeiT is a 224 model
    calib = [torch.randn(batch, 3, size, size, generator=gen) for _ in range(2)]
    export_onnx(model, calib[0], paths["fp32"])
    export_onnx(quantize(model, calib), calib[0], paths["fq"])
    rewrite(paths["fq"], paths["int"])
    return paths
