"""ViT/DeiT: timm parameter names and shapes, forward shapes, the GELU option."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from ivit_onnx.models import vit as vit_module  # noqa: E402
from ivit_onnx.models.layers import QuantPoint  # noqa: E402

from .conftest import TINY, images  # noqa: E402


def timm_vit_state_shapes(dim: int, depth: int, classes: int, patches: int, distilled: bool) -> dict:
    """Parameter names and shapes of a timm VisionTransformer / DeiT checkpoint (patch 16, RGB, MLP x4)."""
    shapes = {
        "cls_token": (1, 1, dim),
        "pos_embed": (1, patches + (2 if distilled else 1), dim),
        "patch_embed.proj.weight": (dim, 3, 16, 16),
        "patch_embed.proj.bias": (dim,),
        "norm.weight": (dim,),
        "norm.bias": (dim,),
        "head.weight": (classes, dim),
        "head.bias": (classes,),
    }
    if distilled:
        shapes.update({"dist_token": (1, 1, dim)})
        shapes.update({"head_dist.weight": (classes, dim), "head_dist.bias": (classes,)})
    for i in range(depth):
        b = f"blocks.{i}."
        shapes.update(
            {
                b + "norm1.weight": (dim,),
                b + "norm1.bias": (dim,),
                b + "attn.qkv.weight": (3 * dim, dim),
                b + "attn.qkv.bias": (3 * dim,),
                b + "attn.proj.weight": (dim, dim),
                b + "attn.proj.bias": (dim,),
                b + "norm2.weight": (dim,),
                b + "norm2.bias": (dim,),
                b + "mlp.fc1.weight": (4 * dim, dim),
                b + "mlp.fc1.bias": (4 * dim,),
                b + "mlp.fc2.weight": (dim, 4 * dim),
                b + "mlp.fc2.bias": (dim,),
            }
        )
    return shapes


@pytest.mark.parametrize(
    "factory, dim, distilled",
    [
        ("vit_tiny_patch16_224", 192, False),
        ("deit_tiny_patch16_224", 192, False),
        ("deit_small_patch16_224", 384, False),
        ("deit_base_patch16_224", 768, False),
        ("deit_tiny_distilled_patch16_224", 192, True),
    ],
)
def test_state_dict_matches_timm(factory, dim, distilled):
    with torch.device("meta"):
        model = getattr(vit_module, factory)()
    got = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    assert got == timm_vit_state_shapes(dim, 12, 1000, 196, distilled)


def test_timm_style_checkpoint_loads_strictly():
    model = vit_module.vit(**TINY, distilled=True)
    expected = timm_vit_state_shapes(32, 2, 10, 16, distilled=True)
    # the tiny config has 8x8 patches and MLP x4 like timm's: adapt the patch kernel only
    expected["patch_embed.proj.weight"] = (32, 3, 8, 8)
    checkpoint = {k: torch.randn(shape) for k, shape in expected.items()}
    model.load_state_dict(checkpoint, strict=True)
    assert torch.equal(model.blocks[1].attn.qkv.weight, checkpoint["blocks.1.attn.qkv.weight"])


@pytest.mark.parametrize("distilled", [False, True])
@pytest.mark.parametrize("gelu", ["erf", "tanh"])
def test_forward_shape(distilled, gelu):
    model = vit_module.vit(**TINY, distilled=distilled, gelu=gelu).eval()
    with torch.no_grad():
        assert model(images(3, 0)).shape == (3, 10)


def test_deit_tiny_forward_shape():
    model = vit_module.deit_tiny_patch16_224(num_classes=7).eval()
    with torch.no_grad():
        assert model(torch.zeros(1, 3, 224, 224)).shape == (1, 7)


def test_quant_points_are_identities():
    model = vit_module.vit(**TINY).eval()
    points = [m for m in model.modules() if isinstance(m, QuantPoint)]
    # input, embed, pos, pos add, norm, head + per block (norm1, res1, norm2, res2, 8 in attention, 3 in MLP)
    assert len(points) == 6 + TINY["depth"] * 15
    x = images(2, 0)
    assert torch.equal(points[0](x), x)


def test_gelu_forms_differ():
    erf = vit_module.vit(**TINY, gelu="erf")
    tanh = vit_module.vit(**TINY, gelu="tanh")
    assert erf.blocks[0].mlp.act.approximate == "none"
    assert tanh.blocks[0].mlp.act.approximate == "tanh"
    with pytest.raises(ValueError, match="gelu"):
        vit_module.vit(**TINY, gelu="relu")
