"""CIFAR loading (search order, download, MD5, broken archives) and the shared augmentation.

Every test runs offline: the real downloader is replaced by one that fails the test, and the
cache folder is a temporary one. Archives are small fakes in the official format.
"""

import dataclasses
import os
import pickle
import urllib.error
from pathlib import Path

import numpy as np
import pytest

from amp_compare.contract.config import ConfigError
from amp_compare.kit import cifar
from amp_compare.kit.cifar import PAD, SPECS, augment_batch, cache_dir, find_archive, load_cifar, search_dirs
from tests.cifar_fixtures import CIFAR10_NAMES, fake_members, write_fake_archive

NAMES = ("cifar10", "cifar100")
REAL_FETCH = cifar.fetch_url  # kept before the autouse fixture below replaces it


@pytest.fixture(autouse=True)
def offline(monkeypatch, tmp_path):
    """No network, no real cache, no AMP_COMPARE_DATA from the environment of whoever runs the tests."""

    def no_network(url, timeout=None):
        pytest.fail(f"tried to download {url}")

    monkeypatch.setattr(cifar, "fetch_url", no_network)
    monkeypatch.delenv(cifar.ENV_VAR, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))


def files_under(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*")) if folder.exists() else []


def assert_one_line(exc: pytest.ExceptionInfo, *needles: str) -> str:
    message = str(exc.value)
    assert "\n" not in message
    for needle in needles:
        assert needle in message, (needle, message)
    return message


def use_md5_of(monkeypatch, name: str, data: bytes) -> None:
    """Make the bytes of a fake archive 'official' for this test."""
    md5 = cifar._md5(data)
    monkeypatch.setitem(SPECS, name, dataclasses.replace(SPECS[name], md5=md5))


# --- loading -----------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_load_from_data_dir_matches_the_pickled_rows(tmp_path, name):
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    path = write_fake_archive(data_dir, name, n_train_per_batch=7, n_test=5, seed=3)
    x_train, y_train, x_test, y_test, classes, source = load_cifar(name, data_dir=data_dir, verify_md5=False)

    members = fake_members(name, 7, 5, seed=3)
    spec = SPECS[name]
    rows = np.concatenate([members[m][b"data"] for m in spec.train_members])
    labels = np.concatenate([members[m][spec.labels_key] for m in spec.train_members])
    assert x_train.shape == (7 * len(spec.train_members), 32, 32, 3) and x_train.dtype == np.uint8
    assert x_test.shape == (5, 32, 32, 3) and x_test.dtype == np.uint8
    assert y_train.dtype == y_test.dtype == np.int64
    assert x_train.flags.c_contiguous and x_test.flags.c_contiguous
    np.testing.assert_array_equal(y_train, labels)
    np.testing.assert_array_equal(y_test, members[spec.test_member][spec.labels_key])
    # Row layout: 1024 red, 1024 green, 1024 blue, each 32x32 row-major.
    i, r, c, ch = 9 % len(rows), 5, 17, 2
    assert x_train[i, r, c, ch] == rows[i, ch * 1024 + r * 32 + c]
    np.testing.assert_array_equal(x_train.reshape(len(rows), -1, 3).transpose(0, 2, 1).reshape(len(rows), -1), rows)
    np.testing.assert_array_equal(x_test[:, 0, 0, 1], members[spec.test_member][b"data"][:, 1024])
    assert classes == (CIFAR10_NAMES if name == "cifar10" else [f"fine_{k:02d}" for k in range(100)])
    assert str(path) in source and "MD5 differs from the official archive" in source and "\n" not in source


@pytest.mark.parametrize("name", NAMES)
def test_load_from_env_var(tmp_path, monkeypatch, name):
    folder = tmp_path / "env-data"
    folder.mkdir()
    path = write_fake_archive(folder, name)
    monkeypatch.setenv(cifar.ENV_VAR, str(folder))
    data = load_cifar(name, verify_md5=False)
    assert find_archive(name) == path and str(path) in data.source
    assert len(data.x_test) == 6


@pytest.mark.parametrize("name", NAMES)
def test_load_from_cache_dir(tmp_path, monkeypatch, name):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "my-cache"))
    assert cache_dir() == tmp_path / "my-cache" / "amp-compare"
    cache_dir().mkdir(parents=True)
    path = write_fake_archive(cache_dir(), name)
    assert find_archive(name) == path
    assert len(load_cifar(name, verify_md5=False).y_train) == 8 * len(SPECS[name].train_members)


def test_search_order_is_data_dir_then_env_then_cache(tmp_path, monkeypatch):
    folders = [tmp_path / n for n in ("explicit", "env")] + [cache_dir()]
    for folder in folders:
        folder.mkdir(parents=True)
        write_fake_archive(folder, "cifar10")
    monkeypatch.setenv(cifar.ENV_VAR, str(folders[1]))
    assert search_dirs(folders[0]) == folders
    assert find_archive("cifar10", folders[0]) == folders[0] / "cifar-10-python.tar.gz"
    assert find_archive("cifar10") == folders[1] / "cifar-10-python.tar.gz"
    monkeypatch.delenv(cifar.ENV_VAR)
    assert find_archive("cifar10", tmp_path / "nowhere") == folders[2] / "cifar-10-python.tar.gz"
    assert find_archive("cifar100") is None


def test_cache_dir_defaults_to_home_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert cache_dir() == tmp_path / ".cache" / "amp-compare"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/dir")  # the XDG spec says to ignore it
    assert cache_dir() == tmp_path / ".cache" / "amp-compare"


def test_unknown_name_is_a_config_error():
    with pytest.raises(ConfigError, match="valid: cifar10, cifar100"):
        load_cifar("cifar1000")


@pytest.mark.parametrize("name", NAMES)
def test_absent_and_offline_says_which_file_to_put_where(tmp_path, monkeypatch, name):
    monkeypatch.setenv(cifar.ENV_VAR, str(tmp_path / "env"))
    with pytest.raises(ConfigError) as info:
        load_cifar(name, data_dir=tmp_path / "explicit")
    spec = SPECS[name]
    assert_one_line(
        info, spec.archive, spec.url, str(tmp_path / "explicit"), str(tmp_path / "env"), str(cache_dir()), "--data-dir"
    )


def test_network_failure_is_one_line_and_caches_nothing(tmp_path, monkeypatch):
    def unreachable(url, timeout=None):
        raise urllib.error.URLError(OSError("[Errno -3] Temporary failure in name resolution"))

    monkeypatch.setattr(cifar, "fetch_url", unreachable)
    with pytest.raises(ConfigError) as info:
        load_cifar("cifar10", data_dir=tmp_path / "d", download=True)
    assert_one_line(info, "cifar-10-python.tar.gz", "name resolution", SPECS["cifar10"].url, str(cache_dir()))
    assert files_under(cache_dir()) == []


def test_fetch_url_returns_the_body(tmp_path):
    path = tmp_path / "body.bin"
    path.write_bytes(b"\x00archive bytes\xff")
    assert REAL_FETCH(path.as_uri()) == b"\x00archive bytes\xff"  # a file:// URL: urllib without a network


@pytest.mark.parametrize("name", NAMES)
def test_download_is_verified_then_cached_atomically(tmp_path, monkeypatch, name):
    archive = write_fake_archive(tmp_path / "source.tar.gz", name, seed=5).read_bytes()
    use_md5_of(monkeypatch, name, archive)
    dest = cache_dir() / SPECS[name].archive
    calls = []

    def fetch(url, timeout=None):
        calls.append(url)
        assert not dest.exists()  # nothing is cached before the bytes are complete and checked
        return archive

    monkeypatch.setattr(cifar, "fetch_url", fetch)
    data = load_cifar(name, download=True)
    assert calls == [SPECS[name].url]
    assert dest.read_bytes() == archive
    assert files_under(cache_dir()) == [SPECS[name].archive]  # no temporary file left behind
    assert "MD5 verified" in data.source and str(dest) in data.source
    load_cifar(name, download=True)  # found in the cache now: no second download
    assert len(calls) == 1


@pytest.mark.parametrize("verify_md5", [True, False])
def test_corrupt_download_caches_nothing(tmp_path, monkeypatch, verify_md5):
    archive = write_fake_archive(tmp_path / "source.tar.gz", "cifar10").read_bytes()
    use_md5_of(monkeypatch, "cifar10", archive)
    monkeypatch.setattr(cifar, "fetch_url", lambda url, timeout=None: archive[: len(archive) // 2])
    with pytest.raises(ConfigError) as info:
        load_cifar("cifar10", download=True, verify_md5=verify_md5)
    assert_one_line(info, "cifar-10-python.tar.gz", "corrupt", "MD5")
    assert files_under(cache_dir()) == []


def test_failed_cache_write_leaves_no_temporary_file(tmp_path, monkeypatch):
    archive = write_fake_archive(tmp_path / "source.tar.gz", "cifar100").read_bytes()
    use_md5_of(monkeypatch, "cifar100", archive)
    monkeypatch.setattr(cifar, "fetch_url", lambda url, timeout=None: archive)

    def disk_full(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", disk_full)
    with pytest.raises(ConfigError) as info:
        load_cifar("cifar100", download=True)
    assert_one_line(info, "No space left on device", "cifar-100-python.tar.gz")
    assert files_under(cache_dir()) == []


def test_md5_mismatch_is_refused(tmp_path):
    path = write_fake_archive(tmp_path, "cifar10")
    with pytest.raises(ConfigError) as info:
        load_cifar("cifar10", data_dir=tmp_path)
    message = assert_one_line(info, str(path), "corrupt or not the official", SPECS["cifar10"].md5, "download again")
    assert cifar._md5(path.read_bytes()) in message


def test_matching_md5_is_reported_as_verified(tmp_path, monkeypatch):
    path = write_fake_archive(tmp_path, "cifar100")
    use_md5_of(monkeypatch, "cifar100", path.read_bytes())
    assert "MD5 verified" in load_cifar("cifar100", data_dir=tmp_path).source


class Boom:
    """A pickle that would run code when loaded; the loader must refuse it."""

    def __reduce__(self):
        return (os.system, ("echo pwned > pwned.txt",))


def truncated(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


BROKEN = {
    "truncated": (lambda p: truncated(write_fake_archive(p, "cifar10")), "EOFError"),
    "empty file": (lambda p: p.joinpath("cifar-10-python.tar.gz").write_bytes(b""), "ReadError"),
    "not gzip": (lambda p: p.joinpath("cifar-10-python.tar.gz").write_bytes(b"<html>404</html>"), "ReadError"),
    "missing member": (
        lambda p: write_fake_archive(p, "cifar10", omit=("cifar-10-batches-py/data_batch_4",)),
        "data_batch_4 is missing",
    ),
    "garbage pickle": (
        lambda p: write_fake_archive(p, "cifar10", replace={"cifar-10-batches-py/test_batch": b"\x80\x02garbage"}),
        "test_batch",
    ),
    "code in pickle": (
        lambda p: write_fake_archive(p, "cifar10", replace={"cifar-10-batches-py/test_batch": pickle.dumps(Boom())}),
        "which a CIFAR pickle never does",
    ),
    "wrong data length": (
        lambda p: write_fake_archive(
            p,
            "cifar10",
            replace={
                "cifar-10-batches-py/data_batch_2": pickle.dumps(
                    {b"data": np.zeros((8, 3000), np.uint8), b"labels": [0] * 8}, protocol=2
                )
            },
        ),
        "data_batch_2 data has shape (8, 3000)",
    ),
    "labels out of range": (
        lambda p: write_fake_archive(
            p,
            "cifar10",
            replace={
                "cifar-10-batches-py/test_batch": pickle.dumps(
                    {b"data": np.zeros((2, 3072), np.uint8), b"labels": [3, 10]}, protocol=2
                )
            },
        ),
        "labels outside 0..9",
    ),
    "not a dict": (
        lambda p: write_fake_archive(p, "cifar10", replace={"cifar-10-batches-py/batches.meta": pickle.dumps([1])}),
        "batches.meta",
    ),
}


@pytest.mark.parametrize("kind", BROKEN)
def test_broken_archive_is_one_line_naming_the_file(tmp_path, monkeypatch, kind):
    monkeypatch.chdir(tmp_path)
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    make, needle = BROKEN[kind]
    make(data_dir)
    before = files_under(tmp_path)
    with pytest.raises(ConfigError) as info:
        load_cifar("cifar10", data_dir=data_dir, verify_md5=False)
    assert_one_line(info, str(data_dir / "cifar-10-python.tar.gz"), "not a readable CIFAR-10 archive", needle)
    assert files_under(tmp_path) == before  # nothing extracted, cached or (for the code pickle) executed


# --- augmentation --------------------------------------------------------------------------


def coded_images(n: int) -> np.ndarray:
    """n copies of one image whose pixel (r, c) holds 1 + 32 r + c: every value names its position."""
    code = 1 + np.arange(32 * 32, dtype=np.float32).reshape(32, 32, 1)
    return np.broadcast_to(code, (n, 32, 32, 1)).copy()


def reference_augment(image: np.ndarray, dy: int, dx: int, flip: bool) -> np.ndarray:
    """The textbook definition, one image at a time."""
    padded = np.pad(image, ((PAD, PAD), (PAD, PAD), (0, 0)))
    crop = padded[dy : dy + 32, dx : dx + 32]
    return crop[:, ::-1] if flip else crop


def test_augment_keeps_shape_and_dtype_and_leaves_input_alone():
    images = np.random.default_rng(0).random((16, 32, 32, 3), dtype=np.float32)
    before = images.copy()
    out = augment_batch(images, np.random.default_rng(1))
    assert out.shape == images.shape and out.dtype == np.float32
    np.testing.assert_array_equal(images, before)


def test_augment_is_deterministic_given_the_rng_state():
    images = np.random.default_rng(0).random((64, 32, 32, 3), dtype=np.float32)
    first = augment_batch(images, np.random.default_rng([7, 1]))
    np.testing.assert_array_equal(first, augment_batch(images, np.random.default_rng([7, 1])))
    assert not np.array_equal(first, augment_batch(images, np.random.default_rng([7, 2])))
    rng = np.random.default_rng(7)
    assert not np.array_equal(augment_batch(images, rng), augment_batch(images, rng))  # the rng moves on


def test_augment_crops_and_flips_at_the_expected_rates():
    n = 4000
    out = augment_batch(coded_images(n), np.random.default_rng(11))
    # Pixels (16, 16) and (16, 17) always come from the interior: decode the crop and flip from them.
    a, b = out[:, 16, 16, 0].astype(int) - 1, out[:, 16, 17, 0].astype(int) - 1
    flip = b < a
    dy = a // 32 - 16 + PAD
    dx = a % 32 - np.where(flip, 15, 16) + PAD
    for i in range(0, n, 97):  # every decoded image is exactly the textbook augmentation
        np.testing.assert_array_equal(out[i], reference_augment(coded_images(1)[0], dy[i], dx[i], flip[i]))

    sigma = np.sqrt(0.25 / n)
    assert abs(flip.mean() - 0.5) < 4 * sigma
    for offsets in (dy, dx):
        counts = np.bincount(offsets, minlength=2 * PAD + 1)
        assert len(counts) == 2 * PAD + 1  # offsets stay within 0..8
        p = 1 / (2 * PAD + 1)
        assert np.all(np.abs(counts / n - p) < 4 * np.sqrt(p * (1 - p) / n)), counts
    assert len(set(zip(dy.tolist(), dx.tolist()))) == (2 * PAD + 1) ** 2  # every crop position occurs


def test_padding_adds_zeros_only_at_the_borders():
    out = augment_batch(np.ones((500, 32, 32, 3), np.float32), np.random.default_rng(3))
    assert set(np.unique(out).tolist()) <= {0.0, 1.0}
    ones = out[..., 0] == 1
    assert np.array_equal(out, np.repeat(ones[..., None], 3, axis=-1).astype(np.float32))
    rows, cols = ones.any(axis=2), ones.any(axis=1)
    # The image part is one rectangle of at least 28x28 touching the opposite edges on each axis.
    np.testing.assert_array_equal(ones, rows[:, :, None] & cols[:, None, :])
    for kept in (rows, cols):
        assert kept.sum(axis=1).min() >= 32 - PAD
        first, last = kept.argmax(axis=1), 31 - kept[:, ::-1].argmax(axis=1)
        assert np.all((first == 0) | (last == 31))
        assert np.array_equal(kept.sum(axis=1), last - first + 1)  # contiguous
    assert (~ones).any(axis=(1, 2)).mean() > 0.9  # 80 of the 81 crop positions pad something


def test_fill_sets_the_padding_value_per_channel():
    fill = np.array([-1.0, -2.0, -3.0], np.float32)
    out = augment_batch(np.ones((200, 32, 32, 3), np.float32), np.random.default_rng(4), fill=fill)
    padded = out[..., 0] != 1
    for ch in range(3):
        np.testing.assert_array_equal(out[..., ch][padded], fill[ch])
    assert padded.any()
