"""nox sessions: compare (default), report, tests, lint, bench, mutants.

Dependencies are declared once, in pyproject.toml; every session installs the project from it.
Options after `--` pass through: `nox -s compare -- --precisions fp32,bf16 --epochs 3`.
"""

from __future__ import annotations

import nox

nox.options.sessions = ["compare"]
nox.options.reuse_venv = "yes"  # torch + tensorflow take ~2 minutes to install; keep them between runs


def _install(session: nox.Session, extras: str = "") -> None:
    session.install("-e", f".{extras}")


@nox.session
def compare(session: nox.Session) -> None:
    """Train the default matrix in both frameworks and write reports/<run-id>/index.html."""
    _install(session)
    session.run("python", "-m", "common", "compare", *session.posargs)


@nox.session
def report(session: nox.Session) -> None:
    """Re-render the report of one or more run folders: nox -s report -- reports/<run-id>."""
    _install(session)
    if not session.posargs:
        session.error("give one or more run folders: nox -s report -- reports/<run-id>")
    session.run("python", "-m", "common", "report", *session.posargs)


@nox.session
def tests(session: nox.Session) -> None:
    """Run the test suite (CPU; GPU tests skip without a GPU)."""
    _install(session, "[test]")
    session.run("pytest", *(session.posargs or ["-q"]))


@nox.session
def lint(session: nox.Session) -> None:
    """ruff over the whole project."""
    session.install("ruff>=0.6")
    session.run("ruff", "check", ".")


@nox.session
def bench(session: nox.Session) -> None:
    """Benchmarks that print ratios measured side by side in one run (AMP speed, overhead, input pipeline)."""
    _install(session)
    session.run("python", "benchmarks/amp_speed.py", *session.posargs)
    session.run("python", "benchmarks/overhead.py", *session.posargs)


@nox.session
def mutants(session: nox.Session) -> None:
    """Mutation check: deliberate single-line mapping/optimizer/model errors, each must fail tests/test_parity.py."""
    _install(session, "[test]")
    session.run("python", "tests/mutants.py", *session.posargs)
