"""The parent's side never imports a framework (each framework runs in its own child process), and no
child-side module imports the parent's side: the layout of amp_compare/ is the process boundary. Within the
parent, harness/report/ (reads records, renders) never imports harness/run/ (plans and runs the cells): what
both use sits below both (harness/common.py, contract/)."""

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
    """Every module under amp_compare/<folder>, subpackages included (harness/run, harness/report)."""
    return sorted("amp_compare." + ".".join(p.relative_to(PACKAGE).with_suffix("").parts)
                  for p in (PACKAGE / folder).rglob("*.py") if p.stem not in ("__init__", "__main__"))


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
        for path in sorted((root / folder).rglob("*.py")):
            for name in imported(path, root.parent):
                parts = name.split(".")
                if parts[0] != "amp_compare" or len(parts) < 2 or parts[1] in ("__main__",):
                    continue
                if parts[1] not in allowed and (root / parts[1]).is_dir():
                    bad.append(f"{path.relative_to(root.parent)}: imports {name}")
    return bad


def test_no_child_side_module_imports_the_harness():
    assert boundary_violations() == []


def report_imports_of_run(root: Path = PACKAGE) -> list[str]:
    """'file: imports module' for every import of harness/run from harness/report (plain, from, relative, in a
    function, or `from amp_compare.harness import run`)."""
    bad = []
    for path in sorted((root / "harness" / "report").rglob("*.py")):
        for name in imported(path, root.parent):
            if name == "amp_compare.harness.run" or name.startswith("amp_compare.harness.run."):
                bad.append(f"{path.relative_to(root.parent)}: imports {name}")
    return bad


def test_the_report_side_never_imports_the_run_side():
    """report/ reads records a run left behind; it must work on a machine (or a folder) where nothing runs."""
    assert (PACKAGE / "harness" / "report").is_dir() and (PACKAGE / "harness" / "run").is_dir()
    assert report_imports_of_run() == []


def test_the_direction_check_sees_a_report_module_importing_the_run_side(tmp_path):
    report = tmp_path / "amp_compare" / "harness" / "report"
    (report / "sub").mkdir(parents=True)
    (report / "a.py").write_text("import amp_compare.harness.run.runner\n")
    (report / "b.py").write_text("def f():\n    from amp_compare.harness.run.cli import EXIT_OK\n")
    (report / "c.py").write_text("from ..run import calibrate\n")
    (report / "d.py").write_text("from amp_compare.harness import run\n")
    (report / "sub" / "e.py").write_text("from ...run.maxbatch import probe\n")
    (report / "ok.py").write_text("from amp_compare.harness.common import SIZE\nfrom . import stats\n"
                                  "from amp_compare.harness.report import runs_table\n")
    found = report_imports_of_run(tmp_path / "amp_compare")
    assert sorted({line.split(":")[0] for line in found}) == [
        f"amp_compare/harness/report/{n}" for n in ("a.py", "b.py", "c.py", "d.py", "sub/e.py")], found


def test_the_boundary_check_sees_a_crossing(tmp_path):
    """Every kind of import that would cross is caught: plain, from, relative, inside a function."""
    for folder in MAY_IMPORT:
        (tmp_path / "amp_compare" / folder).mkdir(parents=True)
    kit = tmp_path / "amp_compare" / "kit"
    (kit / "a.py").write_text("import amp_compare.harness.run.runner\n")
    (kit / "b.py").write_text("def f():\n    from amp_compare.harness.report.stats import pack_correct\n")
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
    """contract/, kit/ and the whole harness (run/ and report/) import without torch, TensorFlow, Keras or JAX."""
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
    assert {"amp_compare.harness.report.render", "amp_compare.harness.run.compare"} <= set(names)


def test_a_framework_child_starts_without_the_report_stack():
    """Every cell starts a child: what it imports besides its framework is paid once per cell. scipy
    (seconds) and matplotlib/seaborn belong to the parent's report, never to the child."""
    code = ("import sys\nimport amp_compare.kit.child\n"
            "heavy = [m for m in ('scipy', 'matplotlib', 'seaborn', 'jinja2') if m in sys.modules]\n"
            "assert not heavy, heavy\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


def report_import_cycle(report: Path) -> list[str]:
    """An import circle among harness/report/'s modules (a module-level or a deferred import alike), [] if none."""
    prefix = "amp_compare.harness.report"
    graph = {}
    for f in report.glob("*.py"):
        deps = set()
        for n in ast.walk(ast.parse(f.read_text())):
            if isinstance(n, ast.ImportFrom) and n.module == prefix:
                deps |= {a.name for a in n.names}
            elif isinstance(n, ast.ImportFrom) and (n.module or "").startswith(prefix + "."):
                deps.add(n.module.split(".")[3])
            elif isinstance(n, ast.Import):
                deps |= {a.name.split(".")[3] for a in n.names if a.name.startswith(prefix + ".")}
        graph[f.stem] = deps - {f.stem}
    state: dict[str, int] = {}

    def visit(module: str, path: list[str]) -> list[str]:
        state[module] = 1
        for dep in sorted(graph.get(module, ())):
            if state.get(dep) == 1:
                return [*path, module, dep]
            if dep not in state and (found := visit(dep, [*path, module])):
                return found
        state[module] = 2
        return []

    return next((c for m in sorted(graph) if m not in state and (c := visit(m, []))), [])


def test_the_report_has_no_import_circle(tmp_path):
    assert report_import_cycle(ROOT / "amp_compare" / "harness" / "report") == []
    (tmp_path / "a.py").write_text("def f():\n    from amp_compare.harness.report.b import g\n")
    (tmp_path / "b.py").write_text("from amp_compare.harness.report import a\n")
    assert report_import_cycle(tmp_path) in (["a", "b", "a"], ["b", "a", "b"])
