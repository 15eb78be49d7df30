"""common/ never imports a framework: each framework runs in its own child process."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_importing_all_of_common_loads_no_framework():
    modules = sorted(p.stem for p in (ROOT / "common").glob("*.py") if p.stem != "__main__")
    code = (
        "import sys\n"
        + "".join(f"import common.{m}\n" for m in modules)
        + "bad = [m for m in ('torch', 'tensorflow', 'keras') if m in sys.modules]\n"
        + "assert not bad, bad\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert len(modules) >= 8


def test_a_framework_child_starts_without_the_report_stack():
    """Every cell starts a child: what it imports besides its framework is paid once per cell. scipy
    (seconds) and matplotlib/seaborn belong to the parent's report, never to the child."""
    code = ("import sys\nimport common.child\n"
            "heavy = [m for m in ('scipy', 'matplotlib', 'seaborn', 'jinja2') if m in sys.modules]\n"
            "assert not heavy, heavy\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
