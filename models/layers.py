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
