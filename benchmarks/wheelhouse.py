"""What a machine without a package index lacks for the GPU check, as a folder of wheels, and its install there.

`prepare` runs where a package index is reachable, on the target's own package list; `install` runs on the target
(Python's standard library and pip only: it is called before anything else is installed there). The requirements are
pyproject.toml's dependencies and, from its extras, REQUIRED_EXTRAS; torch and JAX never come from here: the target's
own CUDA builds are what the check measures.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WHEELHOUSE = ROOT / "wheelhouse"
REQUIRED_EXTRAS = ("keras", "pytest", "pytest-xdist")
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")


def name_of(requirement: str) -> str:
    """A requirement's (or a wheel file's) distribution name, normalised."""
    return re.sub(r"[-_.]+", "-", re.match(r"\s*([A-Za-z0-9._-]+?)(?=-\d|[^A-Za-z0-9._-]|$)",
                                           requirement).group(1)).lower()


def requirements() -> list[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = [r for reqs in project["optional-dependencies"].values() for r in reqs if name_of(r) in REQUIRED_EXTRAS]
    return project["dependencies"] + list(dict.fromkeys(extras))


def installed(pip_list: str) -> dict[str, str]:
    """name -> version from `pip list` output, its columns or --format=freeze."""
    rows = (line.replace("==", " ").split() for line in pip_list.splitlines())
    return {name_of(r[0]): r[1] for r in rows if len(r) >= 2 and r[1][:1].isdigit()}


def unmet(reqs: list[str], have: dict[str, str], python_version: str) -> list[str]:
    """The requirements that apply on the target's Python and that its packages (`have`) do not satisfy."""
    from packaging.markers import default_environment
    from packaging.requirements import Requirement

    env = {**default_environment(), "python_version": python_version, "python_full_version": python_version + ".0",
           "extra": ""}
    out = []
    for text in reqs:
        req = Requirement(text)
        version = have.get(name_of(req.name))
        if (req.marker is None or req.marker.evaluate(env)) and (
                version is None or not req.specifier.contains(version, prereleases=True)):
            out.append(text)
    return out


def requires_dist(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as zf:
        meta = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        return [line.split(":", 1)[1].strip() for line in zf.read(meta).decode().splitlines()
                if line.startswith("Requires-Dist:")]


def needed_wheels(wanted: list[str], wheels: list[Path], have: dict, python_version: str) -> list[Path]:
    """Of the downloaded wheels (pip download fetches every dependency), those named by an unmet requirement of
    `wanted` or of another needed wheel; repeated until no more drop out."""
    while True:
        reqs = wanted + [r for w in wheels for r in requires_dist(w)]
        need = {name_of(r) for r in unmet(reqs, have, python_version)}
        kept = [w for w in wheels if name_of(w.name) in need]
        if kept == wheels:
            return wheels
        wheels = kept


def prepare(installed_list: Path, python_version: str, dest: Path = WHEELHOUSE, platforms=PLATFORMS) -> int:
    """Download into dest the wheels, for the target's Python on `platforms`, of what it lacks."""
    have = installed(Path(installed_list).read_text())
    for framework in ("torch", "jax"):
        if framework not in have:
            print(f"wheelhouse: the target has no {framework}: install its CUDA build there", file=sys.stderr)
    wanted = unmet(requirements(), have, python_version)
    if not wanted:
        print("the target satisfies every requirement: no wheel needed")
        return 0
    dest.mkdir(parents=True, exist_ok=True)
    for old in dest.glob("*.whl"):  # one version of each: a stale one could win the install there
        old.unlink()
    cmd = [sys.executable, "-m", "pip", "download", "--only-binary=:all:", "--python-version", python_version,
           "--implementation", "cp", *[a for p in platforms for a in ("--platform", p)], "-d", str(dest), *wanted]
    print("$ " + " ".join(cmd), flush=True)
    if subprocess.run(cmd).returncode != 0:
        print("wheelhouse: pip download failed (above)", file=sys.stderr)
        return 1
    wheels = sorted(dest.glob("*.whl"))
    kept = needed_wheels(wanted, wheels, have, python_version)
    for wheel in set(wheels) - set(kept):
        wheel.unlink()
    for wheel in kept:
        print(f"{wheel.stat().st_size / 2**20:8.2f} MiB  {wheel.name}")
    print(f"{len(kept)} wheels in {dest}, for: {', '.join(wanted)}")
    return 0


def install(wheelhouse: Path, log: list) -> bool:
    """On the target: the requirements into this Python, what it lacks from the wheelhouse, no index."""
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--find-links", str(wheelhouse), *requirements()]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    log.append(f"==== install: exit {proc.returncode}\n$ {' '.join(cmd)}\n{proc.stdout}{proc.stderr}")
    if proc.returncode != 0:
        print(f"wheelhouse: the install from {wheelhouse} failed:\n{proc.stderr[-3000:]}", file=sys.stderr)
    return proc.returncode == 0
