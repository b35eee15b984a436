"""A tiny fake-quant ViT, its FP32 twin and the integer model, built once per session."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import pytest

from ivit_onnx import rewrite


@dataclass(frozen=True)
class Tiny:
    fq: Path
    fp32: Path
    int: Path

    def model(self) -> onnx.ModelProto:
        return onnx.load(self.int)


@pytest.fixture(scope="session")
def tiny(tmp_path_factory) -> Tiny:
    torch = pytest.importorskip("torch")
    from ivit_onnx.models.export import export_onnx
    from ivit_onnx.models.quant import quantize
    from ivit_onnx.models.vit import vit

    d = tmp_path_factory.mktemp("tiny")
    torch.manual_seed(0)
    m = vit(img_size=32, patch_size=8, in_chans=3, num_classes=10, embed_dim=32, depth=2, num_heads=2,
            mlp_ratio=4).eval()
    calib = [torch.randn(4, 3, 32, 32) for _ in range(4)]
    fq = quantize(m, calib)
    t = Tiny(d / "fq.onnx", d / "fp32.onnx", d / "int.onnx")
    export_onnx(fq, calib[0], t.fq, exporter="torchscript")
    export_onnx(m, calib[0], t.fp32)
    rewrite(t.fq, t.int)
    return t


@pytest.fixture()
def save(tmp_path):
    """``save(model, name)`` writes a ModelProto under tmp_path and returns its path as str."""

    def _save(model: onnx.ModelProto, name: str = "m.onnx") -> str:
        path = tmp_path / name
        onnx.save(model, path)
        return str(path)

    return _save


def x_batch(n: int = 4, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, 3, 32, 32)).astype(np.float32)
