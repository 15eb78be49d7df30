"""Datasets served as identical numpy arrays to both frameworks.

Arrays are NHWC float32 images (already normalised) and int64 labels. The train/validation
split is fixed (it does not depend on the run seed, so every seed is scored on the same
images); the per-epoch shuffle comes from the run seed through `epoch_batches`, which both
frameworks call, so both see the same images in the same batches in the same order.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from common.config import ConfigError

SPLIT_SEED = 20261122  # fixed: the validation set must not change with the run seed
VAL_FRACTION = 0.2
DIGITS_SIZE = 16  # sklearn's digits are 8x8; the model sees them resized once to 16x16
SYNTHETIC_SHAPE = (16, 16, 3)
SYNTHETIC_SAMPLES = 640
NUM_CLASSES = {"digits": 10, "synthetic": 10}


@dataclass(frozen=True)
class Dataset:
    name: str
    x_train: np.ndarray  # (N, H, W, C) float32, normalised
    y_train: np.ndarray  # (N,) int64
    x_val: np.ndarray
    y_val: np.ndarray
    num_classes: int
    source: str  # one line: where the data came from

    @property
    def input_shape(self) -> tuple[int, int, int]:
        return tuple(self.x_train.shape[1:])  # type: ignore[return-value]


def _split(x: np.ndarray, y: np.ndarray, name: str, source: str, num_classes: int) -> Dataset:
    order = np.random.default_rng(SPLIT_SEED).permutation(len(x))
    n_val = int(round(len(x) * VAL_FRACTION))
    val, train = order[:n_val], order[n_val:]
    x_train, x_val = x[train], x[val]
    # Per-channel standardisation with statistics of the training split only.
    mean = x_train.mean(axis=(0, 1, 2), keepdims=True)
    std = x_train.std(axis=(0, 1, 2), keepdims=True) + 1e-6
    return Dataset(
        name=name,
        x_train=((x_train - mean) / std).astype(np.float32),
        y_train=y[train].astype(np.int64),
        x_val=((x_val - mean) / std).astype(np.float32),
        y_val=y[val].astype(np.int64),
        num_classes=num_classes,
        source=source,
    )


def resize_bilinear(images: np.ndarray, size: int) -> np.ndarray:
    """Resize (N, H, W) images to (N, size, size) by bilinear interpolation (align corners)."""
    n, h, w = images.shape
    ys = np.linspace(0, h - 1, size)
    xs = np.linspace(0, w - 1, size)
    y0 = np.floor(ys).astype(int)
    x0 = np.floor(xs).astype(int)
    y1 = np.minimum(y0 + 1, h - 1)
    x1 = np.minimum(x0 + 1, w - 1)
    wy = (ys - y0)[None, :, None]
    wx = (xs - x0)[None, None, :]
    top = images[:, y0][:, :, x0] * (1 - wx) + images[:, y0][:, :, x1] * wx
    bottom = images[:, y1][:, :, x0] * (1 - wx) + images[:, y1][:, :, x1] * wx
    return top * (1 - wy) + bottom * wy


def load_digits() -> Dataset:
    """scikit-learn's bundled handwritten digits (1,797 real 8x8 scans), resized to 16x16x1."""
    from sklearn.datasets import load_digits as sk_load_digits

    bunch = sk_load_digits()
    images = resize_bilinear(bunch.images.astype(np.float64) / 16.0, DIGITS_SIZE)
    x = images[..., None].astype(np.float32)
    source = "scikit-learn load_digits (UCI optical digits, 1797 images, 8x8 resized to 16x16)"
    return _split(x, bunch.target, "digits", source, NUM_CLASSES["digits"])


def load_synthetic() -> Dataset:
    """Learnable class-dependent patterns plus noise: a fixed template per class."""
    rng = np.random.default_rng(SPLIT_SEED)
    templates = rng.normal(size=(NUM_CLASSES["synthetic"], *SYNTHETIC_SHAPE))
    y = rng.integers(0, NUM_CLASSES["synthetic"], size=SYNTHETIC_SAMPLES)
    x = templates[y] + 1.5 * rng.normal(size=(SYNTHETIC_SAMPLES, *SYNTHETIC_SHAPE))
    source = f"synthetic: {SYNTHETIC_SAMPLES} images, one Gaussian template per class plus noise"
    return _split(x.astype(np.float32), y, "synthetic", source, NUM_CLASSES["synthetic"])


LOADERS = {"digits": load_digits, "synthetic": load_synthetic}


def load_dataset(name: str) -> Dataset:
    if name not in LOADERS:
        raise ConfigError(f"unknown dataset {name!r} (valid: {', '.join(LOADERS)})")
    return LOADERS[name]()


def steps_per_epoch(n_train: int, batch_size: int, cap: int | None = None) -> int:
    """Full batches per epoch (the last partial batch is dropped so every step has one shape)."""
    steps = n_train // batch_size
    return min(steps, cap) if cap is not None else steps


def epoch_batches(n_train: int, batch_size: int, seed: int, epoch: int, cap: int | None = None) -> np.ndarray:
    """Indices of each batch of one epoch, shape (steps, batch_size): the shuffle both frameworks use."""
    order = np.random.default_rng([seed, epoch]).permutation(n_train)
    steps = steps_per_epoch(n_train, batch_size, cap)
    return order[: steps * batch_size].reshape(steps, batch_size)


def batch_plan(n_train: int, batch_size: int, seed: int, epochs: int, cap: int | None = None) -> np.ndarray:
    """All epochs' batch indices, shape (epochs, steps, batch_size)."""
    return np.stack([epoch_batches(n_train, batch_size, seed, e, cap) for e in range(epochs)])
