"""Datasets served as identical numpy arrays to both frameworks.

Arrays are NHWC float32 images (already normalised) and int64 labels. The train/validation
split is fixed (it does not depend on the run seed, so every seed is scored on the same
images); the per-epoch shuffle comes from the run seed through `epoch_batches`, which both
frameworks call, so both see the same images in the same batches in the same order.
"""

from __future__ import annotations

import gzip
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from amp_compare.contract.config import ConfigError

SPLIT_SEED = 20261122  # fixed: the validation set must not change with the run seed
VAL_FRACTION = 0.2
DIGITS_SIZE = 16  # sklearn's digits are 8x8; the model sees them resized once to 16x16
SYNTHETIC_SHAPE = (16, 16, 3)
SYNTHETIC_SAMPLES = 2000  # 1,600 train + 400 validation
SYNTHETIC_NOISE = 2.5  # std of the pixel noise on stripes of amplitude 0.6-1.4
SYNTHETIC_CIFAR_SAMPLES = 12_500  # CIFAR's image shape, a fifth of its size: 10,000 train + 2,500 validation
NUM_CLASSES = {"digits": 10, "synthetic": 10, "synthetic_cifar": 10, "cifar10": 10, "cifar100": 100}
# Training images per dataset, known without loading it (kit/schedule.py plans a run's updates from the config
# alone); tests/test_data.py checks each against the loaded arrays.
DIGITS_SAMPLES = 1797
TRAIN_SAMPLES = {"digits": DIGITS_SAMPLES - int(round(DIGITS_SAMPLES * VAL_FRACTION)),
                 "synthetic": SYNTHETIC_SAMPLES - int(round(SYNTHETIC_SAMPLES * VAL_FRACTION)),
                 "synthetic_cifar": SYNTHETIC_CIFAR_SAMPLES - int(round(SYNTHETIC_CIFAR_SAMPLES * VAL_FRACTION)),
                 "cifar10": 50_000, "cifar100": 50_000}


@dataclass(frozen=True)
class Dataset:
    name: str
    x_train: np.ndarray  # (N, H, W, C) float32, normalised
    y_train: np.ndarray  # (N,) int64
    x_val: np.ndarray
    y_val: np.ndarray
    num_classes: int
    source: str  # one line: where the data came from
    fill: np.ndarray | None = None  # per-channel normalised value of a black pixel (augmentation padding)

    @property
    def input_shape(self) -> tuple[int, int, int]:
        return tuple(self.x_train.shape[1:])  # type: ignore[return-value]


def _standardised(name: str, source: str, num_classes: int, x_train: np.ndarray, y_train: np.ndarray,
                  x_val: np.ndarray, y_val: np.ndarray) -> Dataset:
    """Per-channel standardisation with statistics of the training split only."""
    mean = x_train.mean(axis=(0, 1, 2), keepdims=True, dtype=np.float64)
    std = x_train.std(axis=(0, 1, 2), keepdims=True, dtype=np.float64) + 1e-6
    return Dataset(
        name=name,
        x_train=((x_train - mean) / std).astype(np.float32),
        y_train=y_train.astype(np.int64),
        x_val=((x_val - mean) / std).astype(np.float32),
        y_val=y_val.astype(np.int64),
        num_classes=num_classes,
        source=source,
        fill=(-mean / std).astype(np.float32).reshape(-1),
    )


def _split(x: np.ndarray, y: np.ndarray, name: str, source: str, num_classes: int) -> Dataset:
    order = np.random.default_rng(SPLIT_SEED).permutation(len(x))
    n_val = int(round(len(x) * VAL_FRACTION))
    val, train = order[:n_val], order[n_val:]
    return _standardised(name, source, num_classes, x[train], y[train], x[val], y[val])


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


DIGITS_FILE = Path("sklearn", "datasets", "data", "digits.csv.gz")  # where scikit-learn ships the digits


def digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's bundled digits as (images 8x8 float64 in 0..16, labels), as its load_digits returns them.

    Read from the file scikit-learn ships (datasets/data/digits.csv.gz: 64 pixels then the label per row) without
    importing scikit-learn, whose import (scipy.stats among it) took longer than a digits cell's whole training
    on a 2-core CPU, in every child and in the parent's planning. Where the file is not where this version keeps
    it, scikit-learn's own loader. (Looked up along sys.path, not through the import system: the Keras child
    keeps scikit-learn from being imported at all, keras_impl/entry.py.)"""
    path = next((Path(folder) / DIGITS_FILE for folder in sys.path if (Path(folder) / DIGITS_FILE).is_file()), None)
    if path is None:
        from sklearn.datasets import load_digits as sk_load_digits

        bunch = sk_load_digits()
        return bunch.images, bunch.target
    with gzip.open(path, "rt") as f:
        data = np.loadtxt(f, delimiter=",")
    return data[:, :-1].reshape(-1, 8, 8), data[:, -1].astype(int)


def load_digits() -> Dataset:
    """scikit-learn's bundled handwritten digits (1,797 real 8x8 scans), resized to 16x16x1."""
    images, labels = digits_arrays()
    images = resize_bilinear(images.astype(np.float64) / 16.0, DIGITS_SIZE)
    x = images[..., None].astype(np.float32)
    source = "scikit-learn load_digits (UCI optical digits, 1797 images, 8x8 resized to 16x16)"
    return _split(x, labels, "digits", source, NUM_CLASSES["digits"])


def pattern_images(n: int, size: int, channels: int, rng: np.random.Generator,
                   noise: float) -> tuple[np.ndarray, np.ndarray]:
    """Seeded images with class structure a CNN can learn: oriented stripes plus noise.

    Class c is a sinusoidal grating of orientation (c mod 5) x 36 degrees at 2 (classes 0-4) or
    4 (classes 5-9) cycles per image width. Each image draws its own phase (so no fixed template
    can be memorised pixel by pixel), contrast, a brightness offset per channel and Gaussian pixel
    noise of standard deviation `noise`; the label lives only in the orientation and frequency.
    """
    y = rng.integers(0, 10, size=n)
    theta = (y % 5) * np.pi / 5
    cycles = np.where(y < 5, 2.0, 4.0)
    coords = np.arange(size, dtype=np.float64) / size
    yy, xx = np.meshgrid(coords, coords, indexing="ij")
    phase = rng.uniform(0, 2 * np.pi, size=n)
    direction = xx[None] * np.cos(theta)[:, None, None] + yy[None] * np.sin(theta)[:, None, None]
    wave = np.sin(2 * np.pi * cycles[:, None, None] * direction + phase[:, None, None])
    contrast = rng.uniform(0.6, 1.4, size=(n, 1, 1, 1))
    offset = rng.normal(scale=0.3, size=(n, 1, 1, channels))
    x = contrast * wave[..., None] + offset + noise * rng.normal(size=(n, size, size, channels))
    return x.astype(np.float32), y


def load_synthetic() -> Dataset:
    """Learnable synthetic images of 16x16x3 (see pattern_images), seeded: the same on every machine."""
    x, y = pattern_images(SYNTHETIC_SAMPLES, SYNTHETIC_SHAPE[0], SYNTHETIC_SHAPE[2],
                          np.random.default_rng(SPLIT_SEED), noise=SYNTHETIC_NOISE)
    source = (f"synthetic: {SYNTHETIC_SAMPLES} seeded 16x16x3 images, 10 classes of oriented stripes "
              f"(random phase and contrast) plus noise of std {SYNTHETIC_NOISE:g}")
    return _split(x, y, "synthetic", source, NUM_CLASSES["synthetic"])


def load_synthetic_cifar() -> Dataset:
    """Synthetic data of CIFAR's shape (32x32x3, 10 classes), for a GPU run without the archive."""
    x, y = pattern_images(SYNTHETIC_CIFAR_SAMPLES, 32, 3, np.random.default_rng(SPLIT_SEED + 1),
                          noise=SYNTHETIC_NOISE)
    source = (f"synthetic data of CIFAR's shape: {SYNTHETIC_CIFAR_SAMPLES} seeded 32x32x3 images, 10 classes of "
              f"oriented stripes plus noise of std {SYNTHETIC_NOISE:g} (not CIFAR: its archive was absent)")
    return _split(x, y, "synthetic_cifar", source, 10)


def load_cifar_dataset(name: str, data_dir: str | None) -> Dataset:
    """The official CIFAR archive (found, or downloaded when the network allows); test set = validation.

    A download is always MD5-verified. A found archive is read only if it is structurally valid;
    whether its MD5 is the official one is recorded in the run's dataset_source.
    """
    from amp_compare.kit.cifar import load_cifar

    arrays = load_cifar(name, data_dir=data_dir, download=True, verify_md5=False)
    return _standardised(name, arrays.source, NUM_CLASSES[name], arrays.x_train.astype(np.float32) / 255.0,
                         arrays.y_train, arrays.x_test.astype(np.float32) / 255.0, arrays.y_test)


LOADERS = {"digits": load_digits, "synthetic": load_synthetic, "synthetic_cifar": load_synthetic_cifar}


def load_dataset(name: str, data_dir: str | None = None) -> Dataset:
    if name in ("cifar10", "cifar100"):
        return load_cifar_dataset(name, data_dir)
    if name not in LOADERS:
        raise ConfigError(f"unknown dataset {name!r} (valid: {', '.join([*LOADERS, 'cifar10', 'cifar100'])})")
    return LOADERS[name]()


def epoch_images(data: Dataset, seed: int, epoch: int, augment: bool) -> np.ndarray:
    """The training images one epoch sees: augmented (random crop + flip, seeded by seed and epoch) or as is.

    One implementation for both frameworks, so both train on exactly the same augmented pixels.
    """
    if not augment:
        return data.x_train
    from amp_compare.kit.cifar import augment_batch

    return augment_batch(data.x_train, np.random.default_rng([seed, epoch, 1]), fill=data.fill)


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
