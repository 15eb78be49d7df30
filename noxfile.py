"""nox sessions: compare (default), report, tests, lint, bench, mutants.

Dependencies are declared once, in pyproject.toml; every session installs the project from it.
Options after `--` pass through: `nox -s compare -- --precisions fp32,bf16 --epochs 3`.

Environments: `report` gets its own light one (the base dependencies: pandas, seaborn, jinja2, …; no
torch, no TensorFlow). compare, tests and bench need the frameworks (~3.5 GB) and share one
environment, .nox/frameworks, with the `test` extra (which includes `compare`), instead of three copies.
"""

from __future__ import annotations

import sys
from pathlib import Path

import nox

nox.options.sessions = ["compare"]
nox.options.reuse_venv = "yes"  # torch + tensorflow take ~2 minutes to install; keep them between runs

ROOT = Path(__file__).resolve().parent
SHARED_ENV = ROOT / ".nox" / "frameworks"


def _framework_python(session: nox.Session) -> str:
    """The shared environment's interpreter, creating the environment on first use and bringing the project
    (editable, with the `test` extra: frameworks and test tools) up to date in it every time."""
    python = SHARED_ENV / ("Scripts/python.exe" if sys.platform == "win32" else "bin/python")
    if not python.exists():
        # virtualenv comes with nox; the interpreter that runs nox is the one the sessions use
        session.run(sys.executable, "-m", "virtualenv", "--clear", "-q", str(SHARED_ENV), external=True)
    session.run(str(python), "-m", "pip", "install", "-q", "-e", ".[test]", external=True)
    return str(python)


@nox.session(venv_backend="none")
def compare(session: nox.Session) -> None:
    """Train the default matrix in both frameworks and write reports/<run-id>/index.html."""
    python = _framework_python(session)
    session.run(python, "-m", "amp_compare", "compare", *session.posargs, external=True)


@nox.session
def report(session: nox.Session) -> None:
    """Re-render the report of one or more run folders: nox -s report -- reports/<run-id> (no framework installed)."""
    if not session.posargs:
        session.error("give one or more run folders: nox -s report -- reports/<run-id>")
    session.install("-e", ".")
    session.run("python", "-m", "amp_compare", "report", *session.posargs)


@nox.session(venv_backend="none")
def tests(session: nox.Session) -> None:
    """Run the test suite (CPU; GPU tests skip without a GPU)."""
    python = _framework_python(session)
    # --durations=10: the 10 slowest tests, printed every run. -n 3: three pytest-xdist workers on two cores
    # (much of the suite waits on child processes: a timeout, a hanging child, a framework's start; a third
    # worker fills those waits: 5 min 31 s against 5 min 54 s with two, docs/DEVELOPMENT.md), whole files per
    # worker, longest files first (tests/conftest.py LONG_FIRST), so module fixtures run once and the shared tiny
    # compare once.
    default = ["-q", "--durations=10", "-n", "3", "--dist", "loadfile", "--no-loadscope-reorder"]
    session.run(python, "-m", "pytest", *(session.posargs or default), external=True)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff over the whole project."""
    session.install("ruff>=0.6")
    session.run("ruff", "check", ".")


@nox.session(venv_backend="none")
def bench(session: nox.Session) -> None:
    """Benchmarks that print ratios measured side by side in one run (AMP speed, overhead, input pipeline)."""
    python = _framework_python(session)
    session.run(python, "benchmarks/amp_speed.py", *session.posargs, external=True)
    session.run(python, "benchmarks/overhead.py", *session.posargs, external=True)


@nox.session(venv_backend="none")
def mutants(session: nox.Session) -> None:
    """Mutation check: deliberate single-line mapping/optimizer/model errors, each must fail tests/test_parity.py."""
    python = _framework_python(session)
    session.run(python, "tests/mutants.py", *session.posargs, external=True)
