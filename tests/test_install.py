"""Without nox: a machine missing a dependency gets one line saying what to install (exit 2, nothing written),
and rendering a report needs no framework (the light `nox -s report` environment)."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

from amp_compare.harness.run.requirements import declared
from tests.conftest import ROOT

# Runs `python -m amp_compare ARGS` as if the distributions in HIDE were not installed: importing them fails and
# their package metadata is absent (what a fresh machine without them looks like).
HIDDEN_RUN = r"""
import importlib.abc, importlib.metadata as md, runpy, sys
hide, imports_only, argv = sys.argv[1].split(","), sys.argv[2].split(","), sys.argv[3:]
modules = {"scikit-learn": "sklearn"}
blocked = {modules.get(h, h) for h in hide + imports_only if h}
class Hide(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in blocked:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, Hide())
real = md.distribution
def distribution(name):
    if name.lower() in hide:
        raise md.PackageNotFoundError(name)
    return real(name)
md.distribution = distribution
sys.argv = ["amp_compare", *argv]
runpy.run_module("amp_compare", run_name="__main__", alter_sys=True)
"""


def _run(hide: list[str], args: list[str], imports_only: list[str] = (), timeout: int = 120):
    return subprocess.run([sys.executable, "-c", HIDDEN_RUN, ",".join(hide), ",".join(imports_only), *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def _one_line_error(proc, *words):
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    for word in words:
        assert word in lines[0], lines[0]


def test_report_dependencies_name_no_framework():
    needs = declared()
    assert not {"torch", "tensorflow", "keras"} & {d.lower() for d in needs["report"]}
    assert {"torch", "tensorflow", "keras"} <= {d.lower() for d in needs["compare"]}


def test_compare_without_pandas_says_what_to_install(tmp_path):
    proc = _run(["pandas"], ["compare", "--datasets", "synthetic", "--out", str(tmp_path / "reports")])
    _one_line_error(proc, "pandas", "pip install -e '.[compare]'", "nox -s compare")
    assert not (tmp_path / "reports").exists()


def test_report_without_seaborn_says_what_to_install(tmp_path):
    proc = _run(["seaborn"], ["report", str(tmp_path)])
    _one_line_error(proc, "seaborn", "pip install -e .", "nox -s report")


def test_compare_without_either_framework_says_what_to_install(tmp_path):
    proc = _run(["torch", "tensorflow", "keras"], ["compare", "--out", str(tmp_path / "reports")])
    _one_line_error(proc, "PyTorch or TensorFlow", "pip install -e '.[compare]'")
    assert not (tmp_path / "reports").exists()


def test_an_undeclared_missing_module_is_one_line_too(tmp_path):
    # a run folder whose manifest reads, so that report goes on to import its renderer
    (tmp_path / "manifest.json").write_text('{"configs": []}')
    proc = _run([], ["report", str(tmp_path)], imports_only=["jinja2"])  # installed per metadata, import fails
    _one_line_error(proc, "'jinja2'", "pip install")


def test_report_renders_without_any_framework(tiny_run, tmp_path):
    """What the light `nox -s report` environment can do: re-render a run with torch, TensorFlow, Keras and
    scikit-learn absent."""
    _, run_dir = tiny_run
    copy = tmp_path / "reports" / run_dir.name
    shutil.copytree(run_dir, copy)
    (copy / "index.html").unlink()
    # --no-figures: the figures module (matplotlib, seaborn) is imported all the same; drawing them is tested on
    # the tiny compare itself, whose figures report.py draws in the same process as here.
    proc = _run(["torch", "tensorflow", "keras", "scikit-learn"], ["report", str(copy), "--no-figures"], timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert Path(proc.stdout.strip().splitlines()[-1]) == copy / "index.html"
    assert (copy / "index.html").stat().st_size > 10_000


def test_an_installed_copy_runs_a_compare_from_any_folder(tmp_path):
    """A plain (not editable) install of the project, run from a folder that is not the project's, with the
    default relative --out: the cell finishes and its run lands under that folder (the children run in the
    installed package's folder, so the parent resolves the user's paths before a child starts)."""
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                    "--target", str(site), str(ROOT)], check=True, capture_output=True, timeout=300)
    work = tmp_path / "work"
    work.mkdir()
    env = {**os.environ, "PYTHONPATH": str(site)}
    where = subprocess.run([sys.executable, "-c", "import amp_compare; print(amp_compare.__file__)"], cwd=work,
                           env=env, capture_output=True, text=True, check=True)
    assert Path(where.stdout.strip()).is_relative_to(site)  # the installed copy, not the checkout
    proc = subprocess.run([sys.executable, "-m", "amp_compare", "compare", "--frameworks", "torch", "--precisions",
                           "fp32", "--models", "simple_cnn", "--datasets", "synthetic", "--epochs", "1",
                           "--steps-per-epoch", "2", "--seeds", "0", "--run-id", "anywhere", "--no-figures"],
                          cwd=work, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "1 of 1 cells finished" in proc.stdout + proc.stderr
    assert list((work / "reports" / "anywhere" / "cells").glob("*/run.parquet"))
