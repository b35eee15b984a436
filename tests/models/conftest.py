"""Shared fixtures: a tiny ViT with a usable signal, calibration data, and its ONNX exports.

torch is imported inside the fixtures so that the torch-free tests here (bundled model) still run
without it.
"""

from __future__ import annotations

import pytest

TINY = dict(img_size=32, patch_size=8, in_chans=3, num_classes=10, embed_dim=32, depth=2, num_heads=2)


def fan_in_init(model, seed: int = 0):
    """Re-initialize Linear weights with std 1/sqrt(fan_in) so a random tiny model carries signal."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.Linear):
                m.weight.copy_(torch.randn(m.weight.shape, generator=gen) * m.in_features**-0.5)
    return model.eval()


def zero_point_types(model) -> set[str]:
    """Element types of the zero points of all Q/DQ nodes (initializers, possibly behind Identity)."""
    import onnx

    types = {i.name: i.data_type for i in model.graph.initializer}
    for n in model.graph.node:
        if n.op_type == "Identity" and n.input[0] in types:
            types[n.output[0]] = types[n.input[0]]
        if n.op_type == "Constant":
            types[n.output[0]] = n.attribute[0].t.data_type
    return {
        onnx.TensorProto.DataType.Name(types[n.input[2]])
        for n in model.graph.node
        if n.op_type in ("QuantizeLinear", "DequantizeLinear")
    }


def images(n: int, seed: int):
    """Deterministic random images for the tiny config, [n, 3, 32, 32]."""
    import torch

    return torch.randn(n, 3, 32, 32, generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="session")
def tiny_vit():
    torch = pytest.importorskip("torch")
    from ivit_onnx.models.vit import vit

    torch.manual_seed(0)  # the constructor draws from the global generator: fix it, whatever ran before
    return fan_in_init(vit(**TINY))


@pytest.fixture(scope="session")
def calib():
    pytest.importorskip("torch")
    return [images(8, seed) for seed in (1, 2)]


@pytest.fixture(scope="session")
def x():
    pytest.importorskip("torch")
    return images(4, 3)


@pytest.fixture(scope="session")
def tiny_fq(tiny_vit, calib):
    from ivit_onnx.models.quant import quantize

    return quantize(tiny_vit, calib)


@pytest.fixture(scope="session")
def exports(tmp_path_factory, tiny_vit, tiny_fq, x):
    """The tiny ViT exported by each exporter, FP32 and fake-quant: {(exporter, "fp32"|"fq"): path}."""
    from ivit_onnx.models.export import export_onnx

    out = tmp_path_factory.mktemp("exports")
    paths = {}
    for exporter in ("torchscript", "dynamo"):
        for kind, module in (("fp32", tiny_vit), ("fq", tiny_fq)):
            paths[exporter, kind] = out / f"tiny_{exporter}_{kind}.onnx"
            export_onnx(module, x, paths[exporter, kind], exporter=exporter)
    return paths


@pytest.fixture(scope="session")
def calib_np(calib):
    return [b.numpy() for b in calib]
