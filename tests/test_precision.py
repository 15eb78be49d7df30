"""The precision modes are described once (contract/precision.py); nothing else compares their names."""

import ast
from pathlib import Path

from amp_compare.contract import precision as precisions
from amp_compare.contract.config import PRECISIONS, RunConfig

PACKAGE = Path(__file__).resolve().parent.parent / "amp_compare"


def _names_in(node: ast.AST) -> list[str]:
    """Precision names written as string constants in an expression (also inside a tuple, list or set)."""
    return [n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and n.value in precisions.NAMES]


def string_comparisons(root: Path = PACKAGE) -> list[str]:
    """'file:line' of every comparison with a precision name typed as a string (==, !=, in, isin, startswith),
    outside contract/precision.py, the one place that may."""
    found = []
    for path in sorted(root.rglob("*.py")):
        if path.relative_to(root).as_posix() == "contract/precision.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Compare) and any(
                    isinstance(op, (ast.Eq, ast.NotEq, ast.In, ast.NotIn)) for op in node.ops):
                hits = _names_in(node)
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                  and node.func.attr in ("isin", "startswith", "drop", "get")):
                hits = [name for arg in node.args for name in _names_in(arg)]
            else:
                continue
            if hits:
                found.append(f"{path.relative_to(root.parent).as_posix()}:{node.lineno} ({', '.join(hits)})")
    return found


def test_no_module_compares_precision_names():
    assert string_comparisons() == []


def test_the_check_sees_a_string_comparison(tmp_path):
    package = tmp_path / "amp_compare"
    (package / "contract").mkdir(parents=True)
    (package / "a.py").write_text('def f(cfg, df):\n    return cfg.precision == "fp16"\n')
    (package / "b.py").write_text('def f(df):\n    return df[df["precision"].isin(["fp16", "fp16-static"])]\n')
    (package / "c.py").write_text('def f(p):\n    return p in ("bf16",) or p.startswith("fp16")\n')
    (package / "contract" / "precision.py").write_text('def f(p):\n    return p == "fp32"\n')  # allowed there
    (package / "d.py").write_text('LABEL = "fp16"  # a name, not a comparison\n')
    assert sorted({line.split(" ")[0] for line in string_comparisons(package)}) == [
        "amp_compare/a.py:2", "amp_compare/b.py:2", "amp_compare/c.py:2"]


def test_the_table_is_what_runconfig_reads():
    assert PRECISIONS == precisions.NAMES and precisions.REFERENCE in PRECISIONS
    for p in precisions.TABLE:
        cfg = RunConfig(precision=p.name, loss_scale=1024.0 if p.loss_scaling == "static" else None,
                        model="vit" if p.fp8 else "simple_cnn")  # fp8 runs the vit only (contract/fp8.py)
        assert (cfg.mixed, cfg.half, cfg.loss_scaling) == (p.mixed, p.half, p.loss_scaling)
        assert (p.torch_autocast is None) == (p.half is None) and (p.keras_policy == "float32") == (p.half is None)
    assert precisions.scaled_names() == ("fp16", "fp16-static")
    assert precisions.names(half="float16") == ("fp16", "fp16-noscale", "fp16-static")
