"""A small Swin trained on scikit-learn's digits (about 25 s on one CPU thread): Swin's real-data test.

Windows of 2 on the 4x4 token map (patch 2), shifted by 1 in the first stage, so the shifted-window mask,
the cyclic shift, the relative position bias and the patch merging all carry trained weights. Training
reuses the bundled ViT's loop (`make_default.fit`: AdamW, warmup, cosine decay, seeded shuffling).
"""

from __future__ import annotations

import numpy as np
import torch

from .make_default import TRAIN_CONFIG, deterministic, fit
from .swin import SwinTransformer, swin

SWIN_CONFIG = dict(
    img_size=8,
    patch_size=2,
    in_chans=1,
    num_classes=10,
    embed_dim=32,
    depths=(2, 2),
    num_heads=(2, 4),
    window_size=2,
    mlp_ratio=2.0,
)
SWIN_TRAIN = dict(TRAIN_CONFIG, epochs=15, lr=2e-3)


def train_digits_swin(x: np.ndarray, y: np.ndarray, log: bool = False) -> SwinTransformer:
    """Train the digits Swin deterministically (fixed seed, one thread, deterministic algorithms)."""
    with deterministic(SWIN_TRAIN["threads"]):
        torch.manual_seed(SWIN_TRAIN["seed"])
        return fit(swin(**SWIN_CONFIG), x, y, SWIN_TRAIN, log)
