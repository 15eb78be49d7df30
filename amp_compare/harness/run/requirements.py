"""Which declared dependencies a command needs and which of them are missing, standard library only.

pyproject.toml declares them once: `dependencies` are what rendering a report needs (no framework),
the `compare` extra adds the frameworks and what training needs. `python -m amp_compare` checks them
before importing anything else, so a missing package is one line naming it and the command that
installs it, not a traceback. A missing framework alone is no error for compare (its cells are
reported "unavailable", as on a GPU machine with only PyTorch); neither framework is.
"""

from __future__ import annotations

import re
import tomllib
from importlib import metadata
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parents[3] / "pyproject.toml"
DISTRIBUTION = "amp-compare"
# What each framework column needs installed; any one of them runs some cells (JAX alone runs nothing: its
# column is Keras on JAX).
FRAMEWORKS = {"PyTorch": ("torch",), "Keras on TensorFlow": ("tensorflow", "keras"), "Keras on JAX": ("jax", "keras")}
OPTIONAL_FOR_COMPARE = {"torch", "tensorflow", "keras"}  # each side runs without the other's
INSTALL = {"report": "python3 -m pip install -e .", "compare": "python3 -m pip install -e '.[compare]'"}
NOX = {"report": "nox -s report -- reports/<run-id>", "compare": "nox -s compare"}


def _name(requirement: str) -> str:
    return re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement).group(1)


def declared() -> dict[str, list[str]]:
    """{"report": base requirements, "compare": base + the compare extra}, as distribution names."""
    if PYPROJECT.exists():  # a source checkout: the declaration itself
        project = tomllib.loads(PYPROJECT.read_text())["project"]
        base = [_name(r) for r in project.get("dependencies", [])]
        extra = [_name(r) for r in project.get("optional-dependencies", {}).get("compare", [])
                 if not _name(r).startswith(DISTRIBUTION)]
        return {"report": base, "compare": base + extra}
    requires = metadata.requires(DISTRIBUTION) or []  # an installed wheel: its metadata
    base = [_name(r) for r in requires if "extra ==" not in r]
    extra = [_name(r) for r in requires if re.search(r"extra\s*==\s*['\"]compare['\"]", r)]
    return {"report": base, "compare": base + extra}


def installed(distribution: str) -> bool:
    try:
        metadata.distribution(distribution)
    except metadata.PackageNotFoundError:
        return False
    return True


def missing_for(command: str) -> str | None:
    """One sentence saying what `command` lacks and how to install it; None when nothing is missing."""
    if command not in INSTALL:
        return None  # --help, a typo: the argument parser answers those
    try:
        needed = declared()[command]
    except (OSError, KeyError, ValueError, metadata.PackageNotFoundError):
        return None  # nothing declared to check against; a missing module still gets one line in __main__
    optional = OPTIONAL_FOR_COMPARE if command == "compare" else set()
    missing = [d for d in dict.fromkeys(needed) if d.lower() not in optional and not installed(d)]
    if missing:
        return (f"`{command}` needs Python package(s) that are not installed: {', '.join(missing)}. Install them "
                f"from the project folder with `{INSTALL[command]}`, or run through nox (`{NOX[command]}`).")
    if command == "compare" and not any(all(installed(d) for d in needs) for needs in FRAMEWORKS.values()):
        return ("`compare` needs PyTorch or TensorFlow and neither is installed. Install them from the project "
                f"folder with `{INSTALL['compare']}`, or run through nox (`{NOX['compare']}`).")
    return None
