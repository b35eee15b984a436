"""Regenerate the bundled digits ViT: `python -m ivit_onnx.models.make_default` (about a minute).

Trains a small ViT on scikit-learn's digits (fixed seeds, deterministic, one CPU thread: on a shared
2-core machine two OpenMP threads ran 10x slower), fake-quantizes it (min/max
calibration on the training split, no QAT), exports FP32 and fake-quant ONNX next to this file and writes
the JSON with preprocessing, split, configuration and the measured accuracies.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import torch
import torch.nn.functional as F

from . import bundled, digits
from .export import export_onnx
from .quant import quantize
from .vit import VisionTransformer, vit

MODEL_CONFIG = dict(
    img_size=8, patch_size=2, in_chans=1, num_classes=10, embed_dim=64, depth=4, num_heads=4, mlp_ratio=2.0
)
TRAIN_CONFIG = dict(epochs=30, batch_size=32, lr=1e-3, weight_decay=0.05, warmup_epochs=1, seed=0, threads=1)
QUANT_CONFIG = dict(
    act_dtype="int8", residual_bits=8, softmax_scale=1 / 256, quantize_scores=True, qkv="joint"
)
EXPORT_CONFIG = dict(exporter="dynamo", opset=17)
CALIB_BATCH = 256


@contextmanager
def deterministic(threads: int) -> Iterator[None]:
    """Deterministic torch algorithms on ``threads`` threads inside, the previous settings restored after."""
    saved = torch.are_deterministic_algorithms_enabled(), torch.get_num_threads()
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(saved[0])
        torch.set_num_threads(saved[1])


def calibration(x: np.ndarray) -> list[torch.Tensor]:
    """``x`` in batches of ``CALIB_BATCH``: what the min/max calibrations of the digits models see."""
    return [torch.from_numpy(x[i : i + CALIB_BATCH]) for i in range(0, len(x), CALIB_BATCH)]


def train_digits_vit(x: np.ndarray, y: np.ndarray, log: bool = True) -> VisionTransformer:
    """Train the digits ViT with AdamW, linear warmup and cosine decay; deterministic for a fixed seed."""
    with deterministic(TRAIN_CONFIG["threads"]):
        return _train(x, y, TRAIN_CONFIG, log)


def _train(x: np.ndarray, y: np.ndarray, cfg: dict, log: bool) -> VisionTransformer:
    """The training loop proper (global torch settings are handled by the caller)."""
    torch.manual_seed(cfg["seed"])
    return fit(vit(**MODEL_CONFIG), x, y, cfg, log)


def fit(model: torch.nn.Module, x: np.ndarray, y: np.ndarray, cfg: dict, log: bool, tag: str = "epoch"):
    """AdamW, linear warmup over ``cfg['warmup_epochs']`` (0: none), cosine decay, seeded shuffling."""
    x_t, y_t = torch.from_numpy(x), torch.from_numpy(y)
    steps_per_epoch = math.ceil(len(y) / cfg["batch_size"])
    total = cfg["epochs"] * steps_per_epoch
    warmup = max(1, cfg["warmup_epochs"] * steps_per_epoch)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg["lr"], weight_decay=cfg["weight_decay"])
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * s / total))
    )
    shuffle = torch.Generator().manual_seed(cfg["seed"])
    model.train()
    for epoch in range(cfg["epochs"]):
        total_loss = 0.0
        for idx in torch.randperm(len(y), generator=shuffle).split(cfg["batch_size"]):
            loss = F.cross_entropy(model(x_t[idx]), y_t[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            total_loss += loss.item() * len(idx)
        if log:
            print(f"{tag} {epoch + 1}/{cfg['epochs']}: loss {total_loss / len(y):.4f}", flush=True)
    return model.eval()


def torch_accuracy(model: torch.nn.Module, x: np.ndarray, y: np.ndarray) -> float:
    """Top-1 accuracy (percent) of a torch classifier."""
    with torch.no_grad():
        return float((model(torch.from_numpy(x)).argmax(-1).numpy() == y).mean() * 100)


def make_default(out_dir: Path, log: bool = True) -> dict:
    """Train, quantize and export the digits ViT into `out_dir`; return the JSON description."""
    x_train, y_train, x_test, y_test = digits.load_digits_split()
    model = train_digits_vit(x_train, y_train, log)
    fq = quantize(model, calibration(x_train), **QUANT_CONFIG)
    out_dir.mkdir(parents=True, exist_ok=True)
    fp32_path, fq_path = out_dir / bundled.FP32_NAME, out_dir / bundled.FQ_NAME
    example = torch.from_numpy(x_test[:2])
    export_onnx(model, example, fp32_path, **EXPORT_CONFIG)
    export_onnx(fq, example, fq_path, **EXPORT_CONFIG)
    info = {
        "description": "ViT trained on scikit-learn digits; the fake-quant copy is the rewrite demo input",
        "files": {"fp32": bundled.FP32_NAME, "fake_quant": bundled.FQ_NAME},
        "preprocessing": digits.PREPROCESSING,
        "split": {"n_train": int(len(y_train)), "n_test": int(len(y_test)), "seed": digits.SPLIT_SEED},
        "input": {"name": "input", "shape": ["batch", 1, 8, 8], "dtype": "float32"},
        "output": {"name": "logits", "shape": ["batch", 10], "dtype": "float32"},
        "model": {"factory": "ivit_onnx.models.vit.vit", **MODEL_CONFIG},
        "training": TRAIN_CONFIG,
        "quantization": {
            "function": "ivit_onnx.models.quant.quantize",
            **QUANT_CONFIG,
            "weights": "symmetric int8 per output channel",
            "calibration": f"min/max over the training split in batches of {CALIB_BATCH}",
        },
        "export": EXPORT_CONFIG,
        "test_accuracy": {
            "fp32_torch": round(torch_accuracy(model, x_test, y_test), 2),
            "fp32_onnx": round(digits.onnx_accuracy(fp32_path, x_test, y_test), 2),
            "fake_quant_torch": round(torch_accuracy(fq, x_test, y_test), 2),
            "fake_quant_onnx": round(digits.onnx_accuracy(fq_path, x_test, y_test), 2),
        },
        "versions": {
            "torch": torch.__version__,
            "onnx": onnx.__version__,
            "onnxruntime": onnxruntime.__version__,
            "python": platform.python_version(),
        },
    }
    (out_dir / bundled.INFO_NAME).write_text(json.dumps(info, indent=2) + "\n")
    return info


def main(argv: list[str] | None = None) -> None:
    """Command line: regenerate the bundled files (or write them to --out)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=bundled.default_info_path().parent, help="output folder")
    parser.add_argument("--quiet", action="store_true", help="no per-epoch log")
    args = parser.parse_args(argv)
    info = make_default(args.out, log=not args.quiet)
    print(json.dumps(info["test_accuracy"], indent=2))


if __name__ == "__main__":
    main()
