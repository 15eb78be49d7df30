"""The parent's side never imports a framework (each framework runs in its own child process), and no
child-side module imports the parent's side: the layout of amp_compare/ is the process boundary."""

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "amp_compare"
FRAMEWORKS = ("torch", "tensorflow", "keras", "jax")
FRAMEWORK_FREE = ("contract", "kit", "harness")  # the framework packages are torch_impl and keras_impl
# What each folder may import from amp_compare: nothing on the child's side imports the harness.
MAY_IMPORT = {
    "contract": {"contract"},
    "kit": {"contract", "kit"},
    "torch_impl": {"contract", "kit", "torch_impl"},
    "keras_impl": {"contract", "kit", "keras_impl"},
    "harness": {"contract", "kit", "harness"},
}


def modules(folder: str) -> list[str]:
    return sorted(f"amp_compare.{folder}.{p.stem}" for p in (PACKAGE / folder).glob("*.py")
                  if p.stem not in ("__init__", "__main__"))


def imported(path: Path, root: Path = ROOT) -> list[str]:
    """Every module an amp_compare source file imports (at the top or inside a function), absolute."""
    package = ".".join(path.relative_to(root).with_suffix("").parts[:-1])
    names = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the file's own package upwards
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            names.append(base)
            names += [f"{base}.{alias.name}" for alias in node.names]  # `from amp_compare import harness`
    return names


def boundary_violations(root: Path = PACKAGE) -> list[str]:
    """'file: imports module' for every import that crosses the process boundary the wrong way."""
    bad = []
    for folder, allowed in MAY_IMPORT.items():
        for path in sorted((root / folder).glob("*.py")):
            for name in imported(path, root.parent):
                parts = name.split(".")
                if parts[0] != "amp_compare" or len(parts) < 2 or parts[1] in ("__main__",):
                    continue
                if parts[1] not in allowed and (root / parts[1]).is_dir():
                    bad.append(f"{path.relative_to(root.parent)}: imports {name}")
    return bad


def test_no_child_side_module_imports_the_harness():
    assert boundary_violations() == []


def test_the_boundary_check_sees_a_crossing(tmp_path):
    """Every kind of import that would cross is caught: plain, from, relative, inside a function."""
    for folder in MAY_IMPORT:
        (tmp_path / "amp_compare" / folder).mkdir(parents=True)
    kit = tmp_path / "amp_compare" / "kit"
    (kit / "a.py").write_text("import amp_compare.harness.runner\n")
    (kit / "b.py").write_text("def f():\n    from amp_compare.harness.stats import pack_correct\n")
    (kit / "c.py").write_text("from ..harness import cli\n")
    (kit / "d.py").write_text("from amp_compare import harness\n")
    (tmp_path / "amp_compare" / "contract" / "e.py").write_text("from amp_compare.kit import data\n")
    (tmp_path / "amp_compare" / "keras_impl" / "f.py").write_text("from amp_compare.torch_impl import train\n")
    (kit / "ok.py").write_text("from amp_compare.contract import config\nfrom . import data\n")
    found = boundary_violations(tmp_path / "amp_compare")
    assert sorted({line.split(":")[0] for line in found}) == [
        "amp_compare/contract/e.py", "amp_compare/keras_impl/f.py", "amp_compare/kit/a.py", "amp_compare/kit/b.py",
        "amp_compare/kit/c.py", "amp_compare/kit/d.py"], found


def test_importing_all_framework_free_modules_loads_no_framework():
    names = [m for folder in FRAMEWORK_FREE for m in modules(folder)] + ["amp_compare.__main__"]
    code = (
        "import sys\n"
        + "".join(f"import {m}\n" for m in names)
        + f"bad = [m for m in {FRAMEWORKS!r} if m in sys.modules]\n"
        + "assert not bad, bad\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert len(names) >= 25
