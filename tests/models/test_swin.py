"""Swin: timm parameter names, window helpers, shifted-window mask, forward, fake quant and export."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from ivit_onnx.models import swin as swin_module  # noqa: E402
from ivit_onnx.models.export import export_onnx  # noqa: E402
from ivit_onnx.models.quant import quantize  # noqa: E402
from ivit_onnx.models.runtime import cosine, run_onnx  # noqa: E402

from .conftest import fan_in_init, images  # noqa: E402


def timm_swin_state_shapes(dim, depths, heads, window, classes, patch=4, mlp_ratio=4):
    """Parameter names and shapes of a timm (>= 0.9) SwinTransformer checkpoint."""
    shapes = {
        "patch_embed.proj.weight": (dim, 3, patch, patch),
        "patch_embed.proj.bias": (dim,),
        "patch_embed.norm.weight": (dim,),
        "patch_embed.norm.bias": (dim,),
    }
    for i, (depth, h) in enumerate(zip(depths, heads, strict=True)):
        if i:
            shapes[f"layers.{i}.downsample.norm.weight"] = (4 * dim,)
            shapes[f"layers.{i}.downsample.norm.bias"] = (4 * dim,)
            shapes[f"layers.{i}.downsample.reduction.weight"] = (2 * dim, 4 * dim)
            dim *= 2
        for j in range(depth):
            b = f"layers.{i}.blocks.{j}."
            hidden = mlp_ratio * dim
            shapes.update(
                {
                    b + "norm1.weight": (dim,),
                    b + "norm1.bias": (dim,),
                    b + "attn.relative_position_bias_table": ((2 * window - 1) ** 2, h),
                    b + "attn.qkv.weight": (3 * dim, dim),
                    b + "attn.qkv.bias": (3 * dim,),
                    b + "attn.proj.weight": (dim, dim),
                    b + "attn.proj.bias": (dim,),
                    b + "norm2.weight": (dim,),
                    b + "norm2.bias": (dim,),
                    b + "mlp.fc1.weight": (hidden, dim),
                    b + "mlp.fc1.bias": (hidden,),
                    b + "mlp.fc2.weight": (dim, hidden),
                    b + "mlp.fc2.bias": (dim,),
                }
            )
    shapes.update({"norm.weight": (dim,), "norm.bias": (dim,)})
    shapes.update({"head.fc.weight": (classes, dim), "head.fc.bias": (classes,)})
    return shapes


def test_swin_tiny_state_dict_matches_timm():
    with torch.device("meta"):
        model = swin_module.swin_tiny_patch4_window7_224()
    got = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    assert got == timm_swin_state_shapes(96, (2, 2, 6, 2), (3, 6, 12, 24), 7, 1000)
    assert sum(p.numel() for p in model.parameters()) == 28_288_354  # timm: 28.3M


def test_window_partition_round_trip():
    x = torch.arange(2 * 8 * 8 * 3, dtype=torch.float32).reshape(2, 8, 8, 3)
    windows = swin_module.window_partition(x, 4)
    assert windows.shape == (8, 4, 4, 3)
    assert torch.equal(windows[1], x[0, :4, 4:8])
    assert torch.equal(swin_module.window_reverse(windows, 4, 8, 8), x)


def test_relative_position_index():
    index = swin_module.relative_position_index(3)
    assert index.shape == (9, 9)
    assert index.min() == 0 and index.max() == 24
    assert torch.all(index.diagonal() == 12)  # zero offset is the table's centre
    assert torch.equal(index, index.max() - index.T)


def test_shifted_window_mask():
    mask = swin_module.shifted_window_mask(8, 8, 4, 2)
    assert mask.shape == (4, 16, 16)
    assert set(mask.unique().tolist()) == {-100.0, 0.0}
    assert torch.all(mask[0] == 0)  # the top-left window holds one region only
    assert torch.all(mask.diagonal(dim1=1, dim2=2) == 0)


def test_forward_shape_and_shifts():
    model = swin_module.swin_tiny_test().eval()
    shifts = [b.shift for stage in model.layers for b in stage.blocks]
    assert shifts == [0, 2, 0, 2]
    with torch.no_grad():
        assert model(images(3, 0)).shape == (3, 10)


def test_map_no_larger_than_window_is_not_shifted():
    model = swin_module.swin(8, 2, 3, 10, 8, (2,), (2,), 7).eval()  # a 4x4 map, window 7
    for block in model.layers[0].blocks:
        assert block.window == 4 and block.shift == 0 and block.attn_mask is None
        assert block.attn.q_mask is None


@pytest.fixture(scope="module")
def tiny_swin():
    return fan_in_init(swin_module.swin_tiny_test())


def test_fake_quant_close_to_float(tiny_swin):
    x = images(4, 3)
    fq = quantize(tiny_swin, [images(8, 1)])
    with torch.no_grad():
        assert cosine(fq(x), tiny_swin(x)) > 0.99


def test_torchscript_export_matches_torch(tiny_swin, tmp_path):
    x = images(2, 3)
    fq = quantize(tiny_swin, [images(8, 1)])
    model = export_onnx(fq, x, tmp_path / "swin.onnx")
    ops = {n.op_type for n in model.graph.node}
    assert {"QuantizeLinear", "DequantizeLinear", "ReduceMean", "Softmax"} <= ops
    with torch.no_grad():
        assert cosine(run_onnx(model, x.numpy()), fq(x).numpy()) > 0.99


@pytest.mark.slow
def test_dynamo_export_matches_torch(tiny_swin, tmp_path):
    x = images(2, 3)
    fq = quantize(tiny_swin, [images(8, 1)])
    model = export_onnx(fq, x, tmp_path / "swin.onnx", exporter="dynamo")
    with torch.no_grad():
        assert cosine(run_onnx(model, images(3, 4).numpy()), fq(images(3, 4)).numpy()) > 0.99


def test_maps_that_windows_do_not_divide_are_padded():
    model = swin_module.swin(28, 2, 3, 10, 16, (2, 2), (1, 2), 4, 2.0).eval()  # maps 14 and 7, windows 4
    assert [(b.resolution, b.padded, b.shift) for s in model.layers for b in s.blocks] == [
        (14, 16, 0),
        (14, 16, 2),
        (7, 8, 0),
        (7, 8, 2),
    ]
    assert model.layers[0].blocks[1].attn_mask.shape == (16, 16, 16)  # the padded map's 4x4 windows
    with torch.no_grad():
        assert model(images(2, 0)[:, :, :28, :28]).shape == (2, 10)


def test_strided_patch_merging_is_the_same_function():
    merge = swin_module.PatchMerging(8).eval()
    x = torch.randn(2, 6, 6, 8)
    with torch.no_grad():
        plain = merge(x)
        merge.strided = True
        assert torch.equal(merge(x), plain)
