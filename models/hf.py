"""Hugging Face ``transformers`` classifiers built from small configs (no download), on data with margins.

The four families users bring (``ViTForImageClassification``, ``DeiTForImageClassificationWithTeacher``,
``SwinForImageClassification``, ``BertForSequenceClassification``), seeded and small enough for CI, and the
data they are trained, calibrated and compared on: scikit-learn's digits for the vision models (8x8 grey
images, normalized as HF image processors do, ``(x - 0.5) / 0.5``), the synthetic topic task of
``text_task.py`` for BERT. ``train`` fits a model for a few epochs (``make_default.fit``), so that logits
have margins and accuracies mean something. Exports and quantization: ``hf_export.py``, ``hf_quant.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

FAMILIES = ("vit", "deit", "swin", "bert")
VISION = ("vit", "deit", "swin")
PIXELS = "pixel_values"  #: the vision models' input name (HF's)
TEXT_INPUTS = ("input_ids", "attention_mask", "token_type_ids")  #: BERT's, in HF's argument order
SEQ = 16  #: BERT's sentence length (text_task's default; = max_position_embeddings)
TEXT_VOCAB = 64

IMAGE = dict(image_size=8, patch_size=2, num_channels=1, num_labels=10)
_ENCODER = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)


@dataclass(frozen=True)
class Family:
    """One transformers model class and the config it is built from."""

    config_class: str
    model_class: str
    config: dict = field(default_factory=dict)
    task: str = "image-classification"  #: Optimum's task name
    train: dict = field(default_factory=dict)  #: ``make_default.fit`` settings


# epochs: enough for >= 90 % test accuracy (ViT 95.1 %, DeiT 91.6 %, Swin 92.7 %, BERT 99.4 %;
# 10-30 s each on one thread)
_TRAIN = dict(epochs=12, batch_size=32, lr=2e-3, weight_decay=0.05, warmup_epochs=1, seed=0)

SPECS = {
    "vit": Family("ViTConfig", "ViTForImageClassification", {**IMAGE, **_ENCODER}, train=_TRAIN),
    "deit": Family(
        "DeiTConfig",
        "DeiTForImageClassificationWithTeacher",
        {**IMAGE, **_ENCODER},
        train=dict(_TRAIN, epochs=20),
    ),
    # windows of 2 on the 4x4 token map: stage 1 shifts them by 1 (the shifted-window mask), stage 2 is one
    # window (HF then drops the shift), as models/digits_swin.py
    "swin": Family(
        "SwinConfig",
        "SwinForImageClassification",
        dict(IMAGE, embed_dim=16, depths=[2, 2], num_heads=[2, 4], window_size=2, mlp_ratio=2.0),
        train=_TRAIN,
    ),
    "bert": Family(
        "BertConfig",
        "BertForSequenceClassification",
        dict(_ENCODER, vocab_size=TEXT_VOCAB, max_position_embeddings=SEQ, num_labels=3),
        task="text-classification",
        train=dict(_TRAIN, epochs=8, lr=3e-3),
    ),
}


def build(family: str, seed: int = 0):
    """The ``transformers`` model of ``family`` with seeded random weights (transformers' default attention,
    SDPA), in eval mode."""
    import transformers

    spec = SPECS[family]
    config = getattr(transformers, spec.config_class)(**spec.config)
    torch.manual_seed(seed)
    return getattr(transformers, spec.model_class)(config).eval()


@dataclass(frozen=True)
class Data:
    """A family's train/test split as ONNX feeds (name -> array) and int64 labels."""

    train: dict[str, np.ndarray]
    y_train: np.ndarray
    test: dict[str, np.ndarray]
    y_test: np.ndarray

    def calibration(self, n: int = 256, batch: int = 32) -> list[dict[str, np.ndarray]]:
        """The first ``n`` training examples in batches: what the quantizers calibrate on."""
        return [{k: v[i : i + batch] for k, v in self.train.items()} for i in range(0, n, batch)]


def data(family: str) -> Data:
    """Digits for the vision families (HF normalization), ``text_task.make_split`` for BERT."""
    if family in VISION:
        from .digits import load_digits_split

        x_train, y_train, x_test, y_test = load_digits_split()
        norm = lambda x: ((x - 0.5) / 0.5).astype(np.float32)  # noqa: E731
        return Data({PIXELS: norm(x_train)}, y_train, {PIXELS: norm(x_test)}, y_test)
    from .text_task import make_split

    train, test = make_split(1024, 1000, TEXT_VOCAB, SEQ), make_split(500, 7, TEXT_VOCAB, SEQ)
    order = lambda s: {k: s.feeds[k] for k in TEXT_INPUTS}  # noqa: E731
    return Data(order(train), train.labels, order(test), test.labels)


def input_names(family: str) -> tuple[str, ...]:
    return (PIXELS,) if family in VISION else TEXT_INPUTS


class _Logits(torch.nn.Module):
    """A transformers model called with its feeds packed into one tensor (``make_default.fit`` passes one
    tensor per batch), returning its logits."""

    def __init__(self, model, names: tuple[str, ...]):
        super().__init__()
        self.model, self.names = model, names

    def forward(self, packed):
        names = self.names
        feeds = {names[0]: packed} if len(names) == 1 else dict(zip(names, packed.unbind(1), strict=True))
        return self.model(**feeds).logits


def _pack(feeds: dict[str, np.ndarray], names: tuple[str, ...]) -> np.ndarray:
    return feeds[names[0]] if len(names) == 1 else np.stack([feeds[k] for k in names], axis=1)


def train(model, family: str, split: Data, log: bool = False):
    """Fit every weight for a few epochs (AdamW, warmup, cosine; deterministic on one thread); eval mode."""
    from .make_default import deterministic, fit

    names = input_names(family)
    with deterministic(1):
        torch.manual_seed(SPECS[family].train["seed"])
        fit(_Logits(model, names), _pack(split.train, names), split.y_train, SPECS[family].train, log)
    return model.eval()
