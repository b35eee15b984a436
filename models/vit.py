"""Plain-torch ViT / DeiT with timm's parameter names, so timm checkpoints load with `load_state_dict`."""

from __future__ import annotations

import torch
from torch import nn

from .layers import Mlp, QKVAttention, QuantPoint


class PatchEmbed(nn.Module):
    """Non-overlapping patches by a strided Conv2d, flattened to tokens (timm's `patch_embed`)."""

    def __init__(self, img_size: int, patch_size: int, in_chans: int, embed_dim: int):
        super().__init__()
        if img_size % patch_size:
            raise ValueError(f"img_size {img_size} is not a multiple of patch_size {patch_size}")
        self.num_patches = (img_size // patch_size) ** 2
        self.proj = nn.Conv2d(in_chans, embed_dim, kernel_size=patch_size, stride=patch_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x).flatten(2).transpose(1, 2)


class Attention(QKVAttention):
    """Multi-head self-attention written the timm way (qkv Linear, reshape/permute, scaled softmax)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.split_qkv(x)
        attn = self.q_scores((q @ k.transpose(-2, -1)) * self.scale)
        return self.project(self.q_prob(attn.softmax(dim=-1)), v, x.shape)


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(norm1(x)), then x + mlp(norm2(x))."""

    def __init__(self, dim: int, num_heads: int, mlp_ratio: float, gelu: str):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.q_norm1 = QuantPoint()
        self.attn = Attention(dim, num_heads)
        self.q_res1 = QuantPoint("residual")
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.q_norm2 = QuantPoint()
        self.mlp = Mlp(dim, int(dim * mlp_ratio), gelu)
        self.q_res2 = QuantPoint("residual")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.q_res1(x + self.attn(self.q_norm1(self.norm1(x))))
        return self.q_res2(x + self.mlp(self.q_norm2(self.norm2(x))))


class VisionTransformer(nn.Module):
    """ViT / DeiT classifier (class token, optional DeiT distillation token and head)."""

    def __init__(
        self,
        img_size: int = 224,
        patch_size: int = 16,
        in_chans: int = 3,
        num_classes: int = 1000,
        embed_dim: int = 192,
        depth: int = 12,
        num_heads: int = 3,
        mlp_ratio: float = 4.0,
        distilled: bool = False,
        gelu: str = "erf",
    ):
        super().__init__()
        self.q_input = QuantPoint()
        self.patch_embed = PatchEmbed(img_size, patch_size, in_chans, embed_dim)
        self.q_embed = QuantPoint()
        num_tokens = 2 if distilled else 1
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim))
        self.dist_token = nn.Parameter(torch.zeros(1, 1, embed_dim)) if distilled else None
        self.pos_embed = nn.Parameter(torch.zeros(1, self.patch_embed.num_patches + num_tokens, embed_dim))
        self.q_pos = QuantPoint()
        self.q_pos_add = QuantPoint("residual")
        self.blocks = nn.Sequential(*(Block(embed_dim, num_heads, mlp_ratio, gelu) for _ in range(depth)))
        self.norm = nn.LayerNorm(embed_dim, eps=1e-6)
        self.q_norm = QuantPoint()
        self.head = nn.Linear(embed_dim, num_classes)
        self.q_head = QuantPoint()
        self.head_dist = nn.Linear(embed_dim, num_classes) if distilled else None
        self.q_head_dist = QuantPoint() if distilled else None
        self.q_logits = QuantPoint() if distilled else None
        self._init_weights()

    def _init_weights(self) -> None:
        """timm-like init: truncated normal (std .02) for tokens, position embedding and Linear weights."""
        for p in (self.cls_token, self.dist_token, self.pos_embed):
            if p is not None:
                nn.init.trunc_normal_(p, std=0.02)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=0.02)
                nn.init.zeros_(m.bias)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """Tokens after the final norm, [B, tokens, dim]."""
        x = self.q_embed(self.patch_embed(self.q_input(x)))
        # The class (and distillation) tokens share the patch tokens' quantizer, so Concat sees one scale.
        tokens = [self.q_embed(self.cls_token).expand(x.shape[0], -1, -1)]
        if self.dist_token is not None:
            tokens.append(self.q_embed(self.dist_token).expand(x.shape[0], -1, -1))
        x = torch.cat([*tokens, x], dim=1)
        x = self.q_pos_add(x + self.q_pos(self.pos_embed))
        return self.q_norm(self.norm(self.blocks(x)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.forward_features(x)
        logits = self.q_head(self.head(x[:, 0]))
        if self.head_dist is None:
            return logits
        # DeiT at inference: mean of the class-token and distillation-token heads.
        dist = self.q_head_dist(self.head_dist(x[:, 1]))
        return self.q_logits((logits + dist) / 2)


def vit(
    img_size: int,
    patch_size: int,
    in_chans: int,
    num_classes: int,
    embed_dim: int,
    depth: int,
    num_heads: int,
    mlp_ratio: float = 4.0,
    distilled: bool = False,
    gelu: str = "erf",
) -> VisionTransformer:
    """Any ViT configuration (tiny ones for tests: img 32, patch 8, dim 32, depth 2, heads 2)."""
    return VisionTransformer(
        img_size, patch_size, in_chans, num_classes, embed_dim, depth, num_heads, mlp_ratio, distilled, gelu
    )


def vit_tiny_patch16_224(num_classes: int = 1000, gelu: str = "erf") -> VisionTransformer:
    """timm `vit_tiny_patch16_224` (dim 192, depth 12, 3 heads)."""
    return vit(224, 16, 3, num_classes, 192, 12, 3, gelu=gelu)


def deit_tiny_patch16_224(num_classes: int = 1000, gelu: str = "erf") -> VisionTransformer:
    """timm `deit_tiny_patch16_224` (dim 192, depth 12, 3 heads)."""
    return vit(224, 16, 3, num_classes, 192, 12, 3, gelu=gelu)


def deit_small_patch16_224(num_classes: int = 1000, gelu: str = "erf") -> VisionTransformer:
    """timm `deit_small_patch16_224` (dim 384, depth 12, 6 heads)."""
    return vit(224, 16, 3, num_classes, 384, 12, 6, gelu=gelu)


def deit_base_patch16_224(num_classes: int = 1000, gelu: str = "erf") -> VisionTransformer:
    """timm `deit_base_patch16_224` (dim 768, depth 12, 12 heads)."""
    return vit(224, 16, 3, num_classes, 768, 12, 12, gelu=gelu)


def deit_tiny_distilled_patch16_224(num_classes: int = 1000, gelu: str = "erf") -> VisionTransformer:
    """timm `deit_tiny_distilled_patch16_224` (dist_token and head_dist; heads averaged at inference)."""
    return vit(224, 16, 3, num_classes, 192, 12, 3, distilled=True, gelu=gelu)
