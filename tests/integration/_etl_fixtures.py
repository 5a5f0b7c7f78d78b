"""Tiny raw-data fixtures generated at test time: MNIST-format IDX files, image folders."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from sparkdl.etl.samples import digits_28x28, write_mnist_sample


def digits_28(n: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    return digits_28x28(n)


def write_mnist(root: Path, n_train: int = 300, n_test: int = 100, *, gz: bool = False) -> Path:
    """The four MNIST IDX files from upscaled digits."""
    return Path(write_mnist_sample(str(root), n_train, n_test, gz=gz))


def write_image_folder(root: Path, per_class: int = 6, size: int = 12) -> dict[str, np.ndarray]:
    """``root/<cls>/<k>.png|jpg``: 3 classes of solid-colour RGB images (PNG and JPEG)."""
    import tensorflow as tf

    colours = {"red": (250, 10, 10), "green": (10, 250, 10), "blue": (10, 10, 250)}
    out = {}
    for name, rgb in colours.items():
        (root / name).mkdir(parents=True, exist_ok=True)
        img = np.zeros((size, size + 4, 3), np.uint8) + np.array(rgb, np.uint8)
        out[name] = img
        for k in range(per_class):
            if k % 2:
                (root / name / f"{k}.png").write_bytes(tf.io.encode_png(img).numpy())
            else:
                (root / name / f"{k}.jpg").write_bytes(tf.io.encode_jpeg(img, quality=95).numpy())
    return out
