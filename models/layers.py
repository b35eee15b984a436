"""Building blocks shared by the ViT and Swin models: quantization points and the MLP."""

from __future__ import annotations

import torch
from torch import nn

#: Roles a quantization point can have; `quant.quantize` decides per role how (or whether) to quantize.
ROLES = (
    "act",  # an ordinary activation (or a parameter used like one): int8 symmetric or uint8 asymmetric
    "residual",  # the residual stream: 8 or 16 bits
    "prob",  # softmax output: unsigned, fixed scale
    "scores",  # attention scores after scaling (and bias), before softmax: optional
    "qkv",  # the joint output of the qkv Linear (I-ViT style, one scale for q, k and v)
    "qkv_split",  # q, k and v quantized separately, after the split
)

GELU_FORMS = {"erf": "none", "tanh": "tanh"}


class QuantPoint(nn.Module):
    """Identity that marks where an activation gets fake-quantized; `quant.quantize` swaps it out."""

    def __init__(self, role: str = "act"):
        super().__init__()
        if role not in ROLES:
            raise ValueError(f"unknown quantization role {role!r}; expected one of {ROLES}")
        self.role = role

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def extra_repr(self) -> str:
        return f"role={self.role}"


def make_gelu(form: str) -> nn.GELU:
    """GELU in the exact (erf) or tanh form; exporters emit different ONNX patterns for each."""
    if form not in GELU_FORMS:
        raise ValueError(f"gelu must be one of {sorted(GELU_FORMS)}, got {form!r}")
    return nn.GELU(approximate=GELU_FORMS[form])


class Mlp(nn.Module):
    """timm's Mlp (fc1 → GELU → fc2) with a quantization point after each op."""

    def __init__(self, dim: int, hidden: int, gelu: str = "erf"):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.q_fc1 = QuantPoint()
        self.act = make_gelu(gelu)
        self.q_act = QuantPoint()
        self.fc2 = nn.Linear(hidden, dim)
        self.q_fc2 = QuantPoint()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.q_act(self.act(self.q_fc1(self.fc1(x))))
        return self.q_fc2(self.fc2(x))


class QKVAttention(nn.Module):
    """timm's fused-qkv attention plumbing and quantization points, shared by ViT and Swin attention.

    Subclasses compute the scores (``q_scores``/``q_prob`` are theirs to apply) between
    :meth:`split_qkv` and :meth:`project`; parameter names stay timm's (``qkv``, ``proj``).
    """

    def __init__(self, dim: int, num_heads: int):
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"dim {dim} is not a multiple of num_heads {num_heads}")
        self.num_heads = num_heads
        self.scale = (dim // num_heads) ** -0.5
        self.qkv = nn.Linear(dim, dim * 3)
        self.q_qkv = QuantPoint("qkv")
        self.q_q = QuantPoint("qkv_split")
        self.q_k = QuantPoint("qkv_split")
        self.q_v = QuantPoint("qkv_split")
        self.q_scores = QuantPoint("scores")
        self.q_prob = QuantPoint("prob")
        self.q_ctx = QuantPoint()
        self.proj = nn.Linear(dim, dim)
        self.q_proj = QuantPoint()

    def split_qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``[B, N, C]`` → q, k, v of ``[B, heads, N, C/heads]``, each at its quantization point."""
        B, N, C = x.shape
        qkv = self.q_qkv(self.qkv(x)).reshape(B, N, 3, self.num_heads, C // self.num_heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        return self.q_q(q), self.q_k(k), self.q_v(v)

    def project(self, attn: torch.Tensor, v: torch.Tensor, shape: torch.Size) -> torch.Tensor:
        """Probabilities times v, heads merged back to ``shape`` ``[B, N, C]``, output projection."""
        x = self.q_ctx(attn @ v).transpose(1, 2).reshape(*shape)
        return self.q_proj(self.proj(x))
