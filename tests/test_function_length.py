"""No function over 60 lines (issue 27): a function that fits a screen can be read in one go.

Checked here: every module under amp_compare/, one parameter per subpackage so a failure names where.
"""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "amp_compare"
LIMIT = 60
CHECKED = sorted(p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()) + ["__main__.py"]


def long_functions(path: Path, root: Path = PACKAGE) -> list[str]:
    """'file:line name (n lines)' (file relative to root) for every function or method in path longer than LIMIT
    lines."""
    files = sorted(path.rglob("*.py")) if path.is_dir() else [path]
    out = []
    for file in files:
        for node in ast.walk(ast.parse(file.read_text(), str(file))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                first = min([node.lineno, *(d.lineno for d in node.decorator_list)])  # decorators count
                n = node.end_lineno - first + 1
                if n > LIMIT:
                    out.append(f"{file.relative_to(root)}:{node.lineno} {node.name} ({n} lines)")
    return out


@pytest.mark.parametrize("part", CHECKED)
def test_no_function_is_longer_than_a_screen(part):
    assert long_functions(PACKAGE / part) == []


def test_the_check_sees_a_long_function(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(LIMIT))
    (tmp_path / "m.py").write_text(f"def short():\n    pass\n\n\ndef long():\n{body}\n")
    assert long_functions(tmp_path, root=tmp_path) == [f"m.py:5 long ({LIMIT + 1} lines)"]
