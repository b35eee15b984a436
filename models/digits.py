"""scikit-learn's digits as a tiny real-data benchmark: split, preprocessing, ONNX accuracy (torch-free)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

N_TEST = 450  # of 1797 images; the rest (1347) is the training split
SPLIT_SEED = 0  # numpy's legacy RandomState: its permutations are stable across numpy versions
PREPROCESSING = {
    "source": "sklearn.datasets.load_digits (8x8 grey images, integer values 0..16, 10 classes)",
    "transform": "x / 16 -> float32 in [0, 1], shape [N, 1, 8, 8] (NCHW), no resizing",
    "split": f"np.random.RandomState({SPLIT_SEED}).permutation(1797): last {N_TEST} test, rest train",
}


def load_digits_split() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(x_train, y_train, x_test, y_test): float32 NCHW images in [0, 1] and int64 labels."""
    from sklearn.datasets import load_digits

    data = load_digits()
    x = (data.images / 16.0).astype(np.float32)[:, None, :, :]
    y = data.target.astype(np.int64)
    order = np.random.RandomState(SPLIT_SEED).permutation(len(y))
    train, test = order[:-N_TEST], order[-N_TEST:]
    return x[train], y[train], x[test], y[test]


def onnx_accuracy(model_path: str | Path, x: np.ndarray, y: np.ndarray, batch: int = 256) -> float:
    """Top-1 accuracy (percent) of an ONNX classifier on (x, y), run in onnxruntime on the CPU."""
    from .runtime import ort_session

    session = ort_session(model_path)
    name = session.get_inputs()[0].name
    predictions = np.concatenate(
        [session.run(None, {name: x[i : i + batch]})[0].argmax(-1) for i in range(0, len(x), batch)]
    )
    return float((predictions == y).mean() * 100)
