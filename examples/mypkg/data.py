"""Deterministic numpy datasets from a seed: twinbench calls ``function(**dataset_args)``."""

from __future__ import annotations

import numpy as np


def load(seed: int = 0, samples: int = 1024, features: int = 16, classes: int = 4,
         validation: int = 256) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Gaussian blobs: one centre per class, float32 features, int32 labels; a training and a validation split."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(0.0, 2.0, size=(classes, features))

    def split(n: int) -> tuple[np.ndarray, np.ndarray]:
        y = rng.integers(0, classes, size=n).astype(np.int32)
        x = (centres[y] + rng.normal(0.0, 1.0, size=(n, features))).astype(np.float32)
        return x, y

    return {"train": split(samples), "validation": split(validation)}


def regression(seed: int = 0, samples: int = 1024, features: int = 8,
               noise: float = 0.1) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """y = x . w + noise: float32 features and float32 targets of shape [N, 1] (no classes)."""
    rng = np.random.default_rng(seed)
    w = rng.normal(size=(features, 1))

    def split(n: int) -> tuple[np.ndarray, np.ndarray]:
        x = rng.normal(size=(n, features))
        y = x @ w + noise * rng.normal(size=(n, 1))
        return x.astype(np.float32), y.astype(np.float32)

    return {"train": split(samples), "validation": split(samples // 4)}
