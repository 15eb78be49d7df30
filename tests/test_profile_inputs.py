"""Issue 35's three inputs found wrong: refused before any cell starts, one line, exit 2, nothing written."""

import pytest

from amp_compare.contract.config import DATASETS, IMAGE_SIZES

BAD = [
    (["--models", "vit", "--vit-patch", "32"],
     "--vit-patch 32 is larger than the 16x16 images of 'digits' (valid: a divisor of 16: 1, 2, 4, 8, 16)"),
    (["--models", "vit", "--vit-patch", "5"],
     "--vit-patch 5 does not divide the 16x16 images of 'digits': 1 border pixel(s) would be dropped "
     "(valid: 1, 2, 4, 8, 16)"),
    (["--datasets", "cifar10", "--data-dir", "/nonexistent/dir"], "--data-dir '/nonexistent/dir' does not exist"),
]


@pytest.mark.parametrize(("args", "message"), BAD, ids=["patch-32", "patch-5", "data-dir"])
def test_refused_in_one_line_exit_2_nothing_written(tmp_path, capsys, monkeypatch, args, message):
    """Through the CLI's own entry point (what `python -m amp_compare compare` calls), no cell may start."""
    from amp_compare.harness.run.compare import main

    def no_cell_may_run(*args, **kwargs):
        raise AssertionError("bad input reached the cells")

    monkeypatch.setattr("amp_compare.harness.run.compare.run_cells", no_cell_may_run)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    out = tmp_path / "reports"
    assert main(["compare", "--device", "cpu", *args, "--out", str(out)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], lines
    assert not out.exists() and not (tmp_path / "cache").exists()  # no run folder, no download begun


def test_image_sizes_are_the_datasets_own():
    """contract/config.py's IMAGE_SIZES (the patch check) agree with the images kit/data.py makes."""
    from amp_compare.kit.data import load_dataset

    for name in DATASETS:
        if name.startswith("cifar"):
            continue  # the archives are not here; CIFAR's 32x32 is the synthetic_cifar shape
        assert load_dataset(name).input_shape[:2] == (IMAGE_SIZES[name],) * 2, name
