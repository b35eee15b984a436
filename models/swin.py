"""Plain-torch Swin Transformer (timm >= 0.9 layout and parameter names), windowed and shifted attention.

Activations are NHWC between stages as in timm; stage i > 0 starts with its patch merging
(`layers.{i}.downsample`), the classifier is `head.fc` after average pooling. `relative_position_index`
and `attn_mask` are non-persistent buffers, as in timm, so they are not part of the state dict.
A map that windows do not divide is zero-padded on the bottom/right before partitioning and cropped
after (timm >= 0.9). Shapes other than the batch are Python ints, so exports carry constant Reshape
shapes (every tensor's row length is known to the converter).
"""

from __future__ import annotations

import torch
from torch import nn

from .layers import Mlp, QKVAttention, QuantPoint


def _dims(x: torch.Tensor) -> list[int]:
    """The non-batch dims as Python ints (constants in an export with a dynamic batch)."""
    return [int(d) for d in x.shape[1:]]


def window_partition(x: torch.Tensor, window: int) -> torch.Tensor:
    """[B, H, W, C] → [B * H/w * W/w, w, w, C] non-overlapping windows."""
    H, W, C = _dims(x)
    x = x.reshape(-1, H // window, window, W // window, window, C)
    return x.permute(0, 1, 3, 2, 4, 5).reshape(-1, window, window, C)


def window_reverse(windows: torch.Tensor, window: int, H: int, W: int) -> torch.Tensor:
    """Inverse of `window_partition`: windows back to [B, H, W, C]."""
    C = int(windows.shape[-1])
    x = windows.reshape(-1, H // window, W // window, window, window, C)
    return x.permute(0, 1, 3, 2, 4, 5).reshape(-1, H, W, C)


def relative_position_index(window: int) -> torch.Tensor:
    """[w*w, w*w] index into the (2w-1)^2 relative-position bias table (timm's formula)."""
    coords = torch.stack(torch.meshgrid(torch.arange(window), torch.arange(window), indexing="ij")).flatten(1)
    rel = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0) + (window - 1)
    return rel[:, :, 0] * (2 * window - 1) + rel[:, :, 1]


def shifted_window_mask(H: int, W: int, window: int, shift: int) -> torch.Tensor:
    """[windows, w*w, w*w] additive mask: -100 between tokens that the cyclic shift made neighbours.

    H and W are the padded map's (multiples of the window), as in timm."""
    img = torch.zeros(1, H, W, 1)
    regions = (slice(0, -window), slice(-window, -shift), slice(-shift, None))
    for i, (h, w) in enumerate((h, w) for h in regions for w in regions):
        img[:, h, w, :] = i
    ids = window_partition(img, window).reshape(-1, window * window)
    diff = ids.unsqueeze(1) - ids.unsqueeze(2)
    return torch.where(diff != 0, torch.tensor(-100.0), torch.tensor(0.0))


class WindowAttention(QKVAttention):
    """Multi-head attention inside a window, with a learned relative-position bias (and shift mask)."""

    def __init__(self, dim: int, num_heads: int, window: int, masked: bool):
        super().__init__(dim, num_heads)
        self.relative_position_bias_table = nn.Parameter(torch.zeros((2 * window - 1) ** 2, num_heads))
        self.register_buffer("relative_position_index", relative_position_index(window), persistent=False)
        self.q_bias = QuantPoint()
        self.q_mask = QuantPoint() if masked else None
        nn.init.trunc_normal_(self.relative_position_bias_table, std=0.02)

    def relative_position_bias(self) -> torch.Tensor:
        """[1, heads, N, N] bias gathered from the table."""
        n = self.relative_position_index.shape[0]
        table = self.q_bias(self.relative_position_bias_table)
        bias = table.index_select(0, self.relative_position_index.view(-1))  # a Gather in both exporters
        return bias.view(n, n, -1).permute(2, 0, 1).unsqueeze(0)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Scores are quantized after the bias and before the mask, so the -100s do not set their scale."""
        N = int(x.shape[1])
        q, k, v = self.split_qkv(x)
        attn = self.q_scores((q @ k.transpose(-2, -1)) * self.scale + self.relative_position_bias())
        if mask is not None:
            windows = int(mask.shape[0])
            attn = attn.view(-1, windows, self.num_heads, N, N) + self.q_mask(mask).unsqueeze(1).unsqueeze(0)
            attn = attn.view(-1, self.num_heads, N, N)
        return self.project(self.q_prob(attn.softmax(dim=-1)), v, (-1, *_dims(x)))


class SwinTransformerBlock(nn.Module):
    """(Shifted-)window attention and MLP, each pre-norm with a residual add; NHWC in and out."""

    def __init__(self, dim: int, resolution: int, num_heads: int, window: int, shift: int, mlp_ratio: float):
        super().__init__()
        if resolution <= window:  # one window covers the map: no partition, no shift (as timm)
            window, shift = resolution, 0
        self.window, self.shift, self.resolution = window, shift, resolution
        self.padded = -(-resolution // window) * window  # the map zero-padded to whole windows
        self.norm1 = nn.LayerNorm(dim)
        self.q_norm1 = QuantPoint()
        self.attn = WindowAttention(dim, num_heads, window, masked=shift > 0)
        self.q_res1 = QuantPoint("residual")
        self.norm2 = nn.LayerNorm(dim)
        self.q_norm2 = QuantPoint()
        self.mlp = Mlp(dim, int(dim * mlp_ratio))
        self.q_res2 = QuantPoint("residual")
        mask = shifted_window_mask(self.padded, self.padded, window, shift) if shift else None
        self.register_buffer("attn_mask", mask, persistent=False)

    def _attn(self, x: torch.Tensor) -> torch.Tensor:
        H, W, C = _dims(x)
        if self.shift:
            x = torch.roll(x, shifts=(-self.shift, -self.shift), dims=(1, 2))
        pad = self.padded - H
        if pad:
            x = nn.functional.pad(x, (0, 0, 0, pad, 0, pad))
        windows = window_partition(x, self.window).reshape(-1, self.window * self.window, C)
        windows = self.attn(windows, mask=self.attn_mask)
        x = window_reverse(windows.reshape(-1, self.window, self.window, C), self.window, H + pad, W + pad)
        if pad:
            x = x[:, :H, :W, :]
        if self.shift:
            x = torch.roll(x, shifts=(self.shift, self.shift), dims=(1, 2))
        return x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        H, W, C = _dims(x)
        x = self.q_res1(x + self._attn(self.q_norm1(self.norm1(x)))).reshape(-1, H * W, C)
        x = self.q_res2(x + self.mlp(self.q_norm2(self.norm2(x))))
        return x.reshape(-1, H, W, C)


class PatchMerging(nn.Module):
    """2x2 neighbouring tokens concatenated (timm's order), normalized and projected to 2*dim.

    ``strided = True`` gathers them as timm < 0.9 did (four strided slices and a Concat): the same function,
    another exported form."""

    strided = False

    def __init__(self, dim: int):
        super().__init__()
        self.norm = nn.LayerNorm(4 * dim)
        self.q_norm = QuantPoint()
        self.reduction = nn.Linear(4 * dim, 2 * dim, bias=False)
        self.q_reduction = QuantPoint("residual")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        H, W, C = _dims(x)
        if self.strided:
            x = torch.cat([x[:, 0::2, 0::2], x[:, 1::2, 0::2], x[:, 0::2, 1::2], x[:, 1::2, 1::2]], dim=-1)
        else:
            x = (
                x.reshape(-1, H // 2, 2, W // 2, 2, C)
                .permute(0, 1, 3, 4, 2, 5)
                .reshape(-1, H // 2, W // 2, 4 * C)
            )
        return self.q_reduction(self.reduction(self.q_norm(self.norm(x))))


class SwinStage(nn.Module):
    """Optional patch merging followed by blocks alternating plain and shifted windows."""

    def __init__(
        self,
        dim: int,
        out_dim: int,
        resolution: int,
        depth: int,
        num_heads: int,
        window: int,
        mlp_ratio: float,
        downsample: bool,
    ):
        super().__init__()
        self.downsample = PatchMerging(dim) if downsample else nn.Identity()
        shifts = [(i % 2) * (window // 2) for i in range(depth)]
        self.blocks = nn.Sequential(
            *(SwinTransformerBlock(out_dim, resolution, num_heads, window, s, mlp_ratio) for s in shifts)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks(self.downsample(x))


class SwinPatchEmbed(nn.Module):
    """Strided Conv2d patches, NHWC, then LayerNorm (timm's `patch_embed.proj` / `patch_embed.norm`)."""

    def __init__(self, patch_size: int, in_chans: int, embed_dim: int):
        super().__init__()
        self.proj = nn.Conv2d(in_chans, embed_dim, kernel_size=patch_size, stride=patch_size)
        self.q_proj = QuantPoint()
        self.norm = nn.LayerNorm(embed_dim)
        self.q_norm = QuantPoint("residual")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.q_norm(self.norm(self.q_proj(self.proj(x).permute(0, 2, 3, 1))))


class ClassifierHead(nn.Module):
    """Average pool over H and W, then `fc` (timm's `head.fc`)."""

    def __init__(self, dim: int, num_classes: int):
        super().__init__()
        self.q_pool = QuantPoint()
        self.fc = nn.Linear(dim, num_classes)
        self.q_fc = QuantPoint()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.q_fc(self.fc(self.q_pool(x.mean(dim=(1, 2)))))


class SwinTransformer(nn.Module):
    """Swin classifier: patch embedding, stages with patch merging, final norm, pooled linear head."""

    def __init__(
        self,
        img_size: int = 224,
        patch_size: int = 4,
        in_chans: int = 3,
        num_classes: int = 1000,
        embed_dim: int = 96,
        depths: tuple[int, ...] = (2, 2, 6, 2),
        num_heads: tuple[int, ...] = (3, 6, 12, 24),
        window_size: int = 7,
        mlp_ratio: float = 4.0,
    ):
        super().__init__()
        if len(depths) != len(num_heads):
            raise ValueError("depths and num_heads need one entry per stage")
        self.q_input = QuantPoint()
        self.patch_embed = SwinPatchEmbed(patch_size, in_chans, embed_dim)
        resolution, dim, stages = img_size // patch_size, embed_dim, []
        for i, (depth, heads) in enumerate(zip(depths, num_heads, strict=True)):
            out_dim = dim * 2 if i else dim
            resolution = resolution // 2 if i else resolution
            stages.append(SwinStage(dim, out_dim, resolution, depth, heads, window_size, mlp_ratio, i > 0))
            dim = out_dim
        self.layers = nn.Sequential(*stages)
        self.norm = nn.LayerNorm(dim)
        self.q_norm = QuantPoint()
        self.head = ClassifierHead(dim, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=0.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layers(self.patch_embed(self.q_input(x)))
        return self.head(self.q_norm(self.norm(x)))


def swin(
    img_size: int,
    patch_size: int,
    in_chans: int,
    num_classes: int,
    embed_dim: int,
    depths: tuple[int, ...],
    num_heads: tuple[int, ...],
    window_size: int,
    mlp_ratio: float = 4.0,
) -> SwinTransformer:
    """Any Swin configuration."""
    return SwinTransformer(
        img_size, patch_size, in_chans, num_classes, embed_dim, depths, num_heads, window_size, mlp_ratio
    )


def swin_tiny_test(num_classes: int = 10) -> SwinTransformer:
    """Tiny test Swin: 32x32 input, patch 2, windows of 4 shifted by 2 in both stages (dims 16, 32)."""
    return swin(32, 2, 3, num_classes, 16, (2, 2), (1, 2), 4, 2.0)


def swin_tiny_patch4_window7_224(num_classes: int = 1000) -> SwinTransformer:
    """timm `swin_tiny_patch4_window7_224` (dim 96, depths 2-2-6-2, heads 3-6-12-24, window 7)."""
    return swin(224, 4, 3, num_classes, 96, (2, 2, 6, 2), (3, 6, 12, 24), 7)
