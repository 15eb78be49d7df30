"""CIFAR-10 and CIFAR-100 from the official python-version archives, and the standard augmentation.

`load_cifar` looks for the official archive (cifar-10-python.tar.gz / cifar-100-python.tar.gz)
in, in order: an explicit `data_dir` (the `--data-dir` option), the folder named by the
environment variable AMP_COMPARE_DATA, and the user cache folder (`cache_dir()`). When it is
nowhere and downloading is allowed, it fetches it from the official address into the cache,
checks its MD5 and only then renames it into place, so a half or wrong download is never
cached. The archive is read in memory (the expected members only, never extracted to disk)
and served as NHWC uint8 images with int64 labels. Every failure - absent offline, wrong MD5,
truncated tar, missing member, garbage pickle - is a `ConfigError` with one line naming the
file and what to do.

`augment_batch` is the usual CIFAR augmentation (random 32x32 crop of the image padded by 4
pixels, random horizontal flip), in numpy and driven by a numpy Generator, so both frameworks
augment identically. Framework-free: numpy and the standard library only.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import sys
import tarfile
import urllib.request
from dataclasses import dataclass
from http.client import HTTPException
from pathlib import Path
from typing import BinaryIO, NamedTuple

import numpy as np

from amp_compare.contract.atomic import atomic_write_bytes
from amp_compare.contract.config import ConfigError

URL_BASE = "https://www.cs.toronto.edu/~kriz/"
ENV_VAR = "AMP_COMPARE_DATA"
DOWNLOAD_TIMEOUT_S = 10.0  # per socket operation: a dead network fails fast, a slow one still finishes
IMAGE_SHAPE = (32, 32, 3)  # NHWC as served; the archives store each image as 3072 bytes in CHW order
PAD = 4  # augmentation: pixels of padding on each side before the random 32x32 crop


@dataclass(frozen=True)
class CifarSpec:
    """Where one official archive lives and how its pickles are laid out."""

    label: str  # human name used in messages
    archive: str
    md5: str
    train_members: tuple[str, ...]
    test_member: str
    meta_member: str
    labels_key: bytes
    names_key: bytes
    num_classes: int

    @property
    def url(self) -> str:
        return URL_BASE + self.archive

    @property
    def members(self) -> tuple[str, ...]:
        return (*self.train_members, self.test_member, self.meta_member)


SPECS = {
    "cifar10": CifarSpec(
        label="CIFAR-10",
        archive="cifar-10-python.tar.gz",
        md5="c58f30108f718f92721af3b95e74349a",
        train_members=tuple(f"cifar-10-batches-py/data_batch_{i}" for i in range(1, 6)),
        test_member="cifar-10-batches-py/test_batch",
        meta_member="cifar-10-batches-py/batches.meta",
        labels_key=b"labels",
        names_key=b"label_names",
        num_classes=10,
    ),
    "cifar100": CifarSpec(
        label="CIFAR-100",
        archive="cifar-100-python.tar.gz",
        md5="eb9058c3a382ffc7106e4002c42a8d85",
        train_members=("cifar-100-python/train",),
        test_member="cifar-100-python/test",
        meta_member="cifar-100-python/meta",
        labels_key=b"fine_labels",
        names_key=b"fine_label_names",
        num_classes=100,
    ),
}


class CifarArrays(NamedTuple):
    """What `load_cifar` returns; unpacks like a plain tuple."""

    x_train: np.ndarray  # (N, 32, 32, 3) uint8, NHWC
    y_train: np.ndarray  # (N,) int64
    x_test: np.ndarray
    y_test: np.ndarray
    classes: list[str]
    source: str  # one line: where the data came from


class _BadArchive(Exception):
    """The archive's bytes are not a readable CIFAR archive; the message is the one-line reason."""


def _spec(name: str) -> CifarSpec:
    if name not in SPECS:
        raise ConfigError(f"unknown CIFAR dataset {name!r} (valid: {', '.join(SPECS)})")
    return SPECS[name]


def cache_dir() -> Path:
    """The user cache folder: $XDG_CACHE_HOME/amp-compare, else ~/.cache/amp-compare."""
    base = os.environ.get("XDG_CACHE_HOME", "")
    # The XDG spec says to ignore a relative XDG_CACHE_HOME.
    root = Path(base) if os.path.isabs(base) else Path.home() / ".cache"
    return root / "amp-compare"


def search_dirs(data_dir: str | os.PathLike | None = None) -> list[Path]:
    """Folders searched for an archive, in order: data_dir, $AMP_COMPARE_DATA, cache_dir()."""
    dirs = [Path(d).expanduser() for d in (data_dir, os.environ.get(ENV_VAR)) if d]
    dirs.append(cache_dir())
    return list(dict.fromkeys(dirs))  # the same folder named twice is searched (and reported) once


def find_archive(name: str, data_dir: str | os.PathLike | None = None) -> Path | None:
    """The first existing official archive of `name` in `search_dirs(data_dir)`, or None."""
    archive = _spec(name).archive
    for folder in search_dirs(data_dir):
        if (folder / archive).is_file():
            return folder / archive
    return None


def fetch_url(url: str, timeout: float = DOWNLOAD_TIMEOUT_S) -> bytes:
    """The body of `url`. Tests replace this function so they never touch the network."""
    request = urllib.request.Request(url, headers={"User-Agent": "amp-compare"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return response.read()


def _md5(data: bytes | None = None, path: Path | None = None) -> str:
    # usedforsecurity=False: MD5 is an integrity check here, and FIPS builds refuse it otherwise.
    digest = hashlib.md5(usedforsecurity=False)
    if data is not None:
        digest.update(data)
    else:
        with open(path, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or "no detail"
    return f"{type(exc).__name__}: {text[:200]}"


def download_archive(name: str) -> Path:
    """Fetch the official archive into cache_dir(), MD5-checked before it is renamed into place.

    Raises ConfigError with a one-line reason (the caller adds what to do); nothing is left behind.
    """
    spec = _spec(name)
    dest = cache_dir() / spec.archive
    print(f"downloading {spec.url} to {dest.parent}", file=sys.stderr)
    try:
        data = fetch_url(spec.url)
    except (OSError, HTTPException, ValueError) as exc:  # URLError and timeouts are OSErrors
        raise ConfigError(_one_line(exc)) from None
    # A download is always checked: whatever the official address serves must be the official archive.
    actual = _md5(data)
    if actual != spec.md5:
        raise ConfigError(f"the download is corrupt: MD5 {actual}, expected {spec.md5}")
    try:
        atomic_write_bytes(dest, data)
    except OSError as exc:
        raise ConfigError(f"cannot write {dest}: {_one_line(exc)}") from None
    return dest


class _CifarUnpickler(pickle.Unpickler):
    """Loads only what CIFAR pickles contain: dicts, lists, bytes, ints and numpy uint8 arrays.

    A pickle can name any callable; refusing all others means a stray file in a data folder can
    not run code, and turns garbage into a clean error.
    """

    ALLOWED = {
        ("numpy.core.multiarray", "_reconstruct"),  # how numpy 1 (and the official archives) name it
        ("numpy._core.multiarray", "_reconstruct"),  # numpy 2
        ("numpy.core.multiarray", "scalar"),
        ("numpy._core.multiarray", "scalar"),
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        ("_codecs", "encode"),  # how Python 3 writes bytes with pickle protocol 2
    }

    def find_class(self, module: str, name: str):
        if (module, name) not in self.ALLOWED:
            raise pickle.UnpicklingError(f"refers to {module}.{name}, which a CIFAR pickle never does")
        return super().find_class(module, name)


def _decode(value) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def _batch(member: str, obj, spec: CifarSpec) -> tuple[np.ndarray, np.ndarray]:
    """One data pickle as (images NHWC uint8, labels int64), checked for shape and range."""
    if not isinstance(obj, dict):
        raise _BadArchive(f"{member} holds a {type(obj).__name__}, not a dict")
    for key in (b"data", spec.labels_key):
        if key not in obj:
            raise _BadArchive(f"{member} has no {key.decode()!r} entry")
    data = obj[b"data"]
    if not (isinstance(data, np.ndarray) and data.dtype == np.uint8 and data.ndim == 2 and data.shape[1] == 3072):
        shape, dtype = getattr(data, "shape", "?"), getattr(data, "dtype", type(data).__name__)
        raise _BadArchive(f"{member} data has shape {shape} and dtype {dtype}, expected (N, 3072) uint8")
    try:
        labels = np.asarray(obj[spec.labels_key], dtype=np.int64)
    except (TypeError, ValueError, OverflowError):
        raise _BadArchive(f"{member} labels are not integers") from None
    if labels.shape != (len(data),):
        raise _BadArchive(f"{member} has {len(data)} images but labels of shape {labels.shape}")
    if len(labels) and not (0 <= labels.min() and labels.max() < spec.num_classes):
        raise _BadArchive(f"{member} has labels outside 0..{spec.num_classes - 1}")
    # Rows are 3 planes of 32x32 (R, G, B), each row-major: CHW, served as HWC.
    images = data.reshape(len(data), 3, 32, 32).transpose(0, 2, 3, 1)
    return images, labels


def _read_archive(fileobj: BinaryIO, spec: CifarSpec) -> tuple[np.ndarray, ...]:
    """Parse the expected members of an official-format archive; raise _BadArchive if it is not one."""
    member = None  # the member being read, to name it in the error
    found = {}
    try:
        with tarfile.open(fileobj=fileobj, mode="r:gz") as tar:
            # One sequential pass: a backward seek in a .tar.gz means decompressing it again.
            for info in tar:
                if info.name not in spec.members or info.name in found:
                    continue
                member = info.name
                if not info.isfile():
                    raise _BadArchive(f"{member} is not a regular file")
                found[member] = _CifarUnpickler(tar.extractfile(info), encoding="bytes").load()
                member = None
                if len(found) == len(spec.members):
                    break
    except _BadArchive:
        raise
    except Exception as exc:  # truncated gzip, bad tar headers, garbage pickles: any exception type
        raise _BadArchive(f"{member}: {_one_line(exc)}" if member else _one_line(exc)) from None
    missing = [m for m in spec.members if m not in found]
    if missing:
        raise _BadArchive(f"member {missing[0]} is missing")

    meta = found[spec.meta_member]
    names = meta.get(spec.names_key) if isinstance(meta, dict) else None
    if not isinstance(names, list) or len(names) != spec.num_classes:
        raise _BadArchive(f"{spec.meta_member} has no list of {spec.num_classes} {spec.names_key.decode()!r}")
    train = [_batch(m, found[m], spec) for m in spec.train_members]
    x_test, y_test = _batch(spec.test_member, found[spec.test_member], spec)
    # One copy from the transposed views into a C-contiguous NHWC array (np.concatenate keeps their layout).
    x_train = np.empty((sum(len(y) for _, y in train), *IMAGE_SHAPE), dtype=np.uint8)
    start = 0
    for x, _ in train:
        x_train[start : start + len(x)] = x
        start += len(x)
    y_train = np.concatenate([y for _, y in train])
    return x_train, y_train, np.ascontiguousarray(x_test), y_test, [_decode(n) for n in names]


def load_cifar(
    name: str,
    data_dir: str | os.PathLike | None = None,
    download: bool = False,
    verify_md5: bool = True,
) -> CifarArrays:
    """CIFAR-10 or CIFAR-100 ("cifar10", "cifar100") as NHWC uint8 images and int64 labels.

    data_dir: a folder searched first (see `search_dirs`). download: fetch the official archive
    into cache_dir() when it is found nowhere. verify_md5: check a found archive against the
    official MD5 (tests turn it off to load small archives in the official format; a download is
    always checked). Raises ConfigError, one line, on any problem.
    """
    spec = _spec(name)
    path = find_archive(name, data_dir)
    verified = False
    if path is None:
        reason = "downloading was not allowed"
        if download:
            try:
                path = download_archive(name)
                verified = True
            except ConfigError as exc:
                reason = str(exc)
        if path is None:
            dirs = ", ".join(str(d) for d in search_dirs(data_dir))
            raise ConfigError(
                f"{spec.label} archive {spec.archive} not found in {dirs} and could not be downloaded ({reason}): "
                f"download {spec.url} and put it in one of those folders or pass --data-dir"
            )
    try:
        if verify_md5 and not verified:
            actual = _md5(path=path)
            if actual != spec.md5:
                raise ConfigError(
                    f"{path} is corrupt or not the official {spec.label} archive "
                    f"(MD5 {actual}, expected {spec.md5}): delete it and download again"
                )
            verified = True
        with open(path, "rb") as fh:
            x_train, y_train, x_test, y_test, classes = _read_archive(fh, spec)
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {_one_line(exc)}") from None
    except _BadArchive as exc:
        raise ConfigError(
            f"{path} is not a readable {spec.label} archive ({exc}): delete it and download {spec.url} again"
        ) from None
    if verified:
        check = "official MD5 verified"
    else:  # not enforced (verify_md5=False), but the report still says whether this is the official file
        check = "MD5 matches the official archive" if _md5(path=path) == spec.md5 else \
            "MD5 differs from the official archive: not the official release"
    source = (
        f"{spec.label} from {path} ({check}): {len(x_train)} train / {len(x_test)} test images, {len(classes)} classes"
    )
    return CifarArrays(x_train, y_train, x_test, y_test, classes, source)


def augment_batch(images: np.ndarray, rng: np.random.Generator, fill: float | np.ndarray = 0.0) -> np.ndarray:
    """Standard CIFAR augmentation of an NHWC batch: random crop after padding, random horizontal flip.

    Each image is padded by PAD pixels on every side with `fill` (0 by default; pass the
    normalised value of black, per channel, to pad normalised images the way torchvision pads
    raw ones), cropped back to its size at a uniformly random offset (0..2*PAD on each axis)
    and mirrored left-right with probability 0.5. Consumes from `rng`, in this order: the row
    offsets, the column offsets, then the flips (n each), so the result depends only on the
    images and the rng state. Returns a new array of the same shape and dtype.
    """
    if images.ndim != 4:
        raise ValueError(f"augment_batch expects an NHWC batch, got shape {images.shape}")
    n, h, w, c = images.shape
    padded = np.empty((n, h + 2 * PAD, w + 2 * PAD, c), dtype=images.dtype)
    padded[...] = fill
    padded[:, PAD : PAD + h, PAD : PAD + w] = images
    rows = rng.integers(0, 2 * PAD + 1, size=n)
    cols = rng.integers(0, 2 * PAD + 1, size=n)
    flips = rng.random(n) < 0.5
    out = np.empty_like(images)
    # A loop of n slice copies beats one fancy-index gather here (about 1 ms against 3 ms for 256 images):
    # each copy moves whole rows, the gather moves one 3-channel pixel at a time.
    for i, (y, x, flip) in enumerate(zip(rows.tolist(), cols.tolist(), flips.tolist())):
        crop = padded[i, y : y + h, x : x + w]
        out[i] = crop[:, ::-1] if flip else crop
    return out
