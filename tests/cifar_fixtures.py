"""Small CIFAR archives in exactly the official python-version format, for tests.

`write_fake_archive` writes cifar-10-python.tar.gz / cifar-100-python.tar.gz with the official
member names (plus the directory entry and stray file the official archives carry) and pickled
dicts with the official keys and types: b"data" a uint8 (N, 3072) array of CHW rows, labels as
lists of ints, names as lists of bytes, pickle protocol 2 like the original cPickle files. Only
the size and the pixels differ (random, from `seed`), so the MD5 is not the official one:
load them with verify_md5=False. `fake_members` gives the dicts themselves, to compare against.
"""

from __future__ import annotations

import io
import pickle
import tarfile
from pathlib import Path

import numpy as np

from amp_compare.kit.cifar import SPECS

CIFAR10_NAMES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
STRAY_MEMBERS = {"cifar10": "cifar-10-batches-py/readme.html", "cifar100": "cifar-100-python/file.txt~"}


def _images(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.integers(0, 256, size=(n, 3072), dtype=np.uint8)


def fake_members(name: str, n_train_per_batch: int, n_test: int, seed: int) -> dict[str, dict]:
    """The dict pickled into each member of the fake archive, keyed by member name.

    CIFAR-10 has five training batches of n_train_per_batch images each; CIFAR-100 has a
    single training member, which gets n_train_per_batch images.
    """
    spec = SPECS[name]
    rng = np.random.default_rng(seed)
    files = [f"fake_{i:05d}.png".encode() for i in range(max(n_train_per_batch, n_test))]
    members: dict[str, dict] = {}
    if name == "cifar10":
        for i, member in enumerate(spec.train_members, start=1):
            members[member] = {
                b"batch_label": f"training batch {i} of 5".encode(),
                b"labels": rng.integers(0, 10, n_train_per_batch).tolist(),
                b"data": _images(rng, n_train_per_batch),
                b"filenames": files[:n_train_per_batch],
            }
        members[spec.test_member] = {
            b"batch_label": b"testing batch 1 of 1",
            b"labels": rng.integers(0, 10, n_test).tolist(),
            b"data": _images(rng, n_test),
            b"filenames": files[:n_test],
        }
        members[spec.meta_member] = {
            b"num_cases_per_batch": n_train_per_batch,
            b"label_names": [n.encode() for n in CIFAR10_NAMES],
            b"num_vis": 3072,
        }
        return members
    for member, n, label in (
        (spec.train_members[0], n_train_per_batch, b"training"),
        (spec.test_member, n_test, b"testing"),
    ):
        fine = rng.integers(0, 100, n)
        members[member] = {
            b"filenames": files[:n],
            b"batch_label": label + b" batch 1 of 1",
            b"fine_labels": fine.tolist(),
            b"coarse_labels": (fine // 5).tolist(),
            b"data": _images(rng, n),
        }
    members[spec.meta_member] = {
        b"fine_label_names": [f"fine_{i:02d}".encode() for i in range(100)],
        b"coarse_label_names": [f"coarse_{i:02d}".encode() for i in range(20)],
    }
    return members


def write_fake_archive(
    path: str | Path,
    name: str,
    n_train_per_batch: int = 8,
    n_test: int = 6,
    seed: int = 0,
    *,
    omit: tuple[str, ...] = (),
    replace: dict[str, bytes] | None = None,
) -> Path:
    """Write a small official-format archive of `name` ("cifar10" or "cifar100") and return its path.

    path: a folder (the archive gets its official file name inside it) or the archive's file path.
    omit: member names to leave out; replace: raw bytes to store for a member instead of its
    pickle (both for tests of broken archives).
    """
    spec = SPECS[name]
    path = Path(path)
    if path.is_dir():
        path = path / spec.archive
    replace = replace or {}
    folder = spec.meta_member.split("/")[0]
    members = fake_members(name, n_train_per_batch, n_test, seed)
    with tarfile.open(path, "w:gz") as tar:
        directory = tarfile.TarInfo(folder)
        directory.type, directory.mode = tarfile.DIRTYPE, 0o755
        tar.addfile(directory)
        contents = {m: replace.get(m, pickle.dumps(obj, protocol=2)) for m, obj in members.items()}
        contents[STRAY_MEMBERS[name]] = b"not a pickle: the loader must skip it\n"
        for member, data in contents.items():
            if member in omit:
                continue
            info = tarfile.TarInfo(member)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return path
