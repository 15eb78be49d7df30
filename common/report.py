"""Render a compare run's folder into index.html, summary.md, figures/ and data/.

`render_report(run_dir)` reads only what the run wrote (manifest.json and the cells' record
tables), so a report can be re-rendered at any time with `nox -s report -- reports/<run-id>`
and renders from partial results too: missing or failed cells are named, never hidden.
"""

from __future__ import annotations

import html
import json
from pathlib import Path

import jinja2
import pandas as pd

from common import records
from common.env import cpu_half_precision_verdict
from common.figures import make_figures
from common.summary import findings, formatted_summary, summary_table

TEMPLATES = Path(__file__).parent / "templates"
SECTIONS = [("summary", "Summary"), ("speed", "Speed"), ("memory", "Memory"), ("accuracy", "Accuracy"),
            ("loss_scaling", "Loss scaling"), ("cells", "Cells"), ("environment", "Environment"),
            ("reproduce", "Reproduce")]


def load_manifest(run_dir: Path) -> dict:
    path = Path(run_dir) / "manifest.json"
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"{run_dir} is not a compare run folder (no manifest.json)") from None


def _env() -> jinja2.Environment:
    return jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True,
                              undefined=jinja2.StrictUndefined)


def table_html(df: pd.DataFrame) -> str:
    head = "".join(f"<th class='l'>{html.escape(c)}</th>" if i < 4 else f"<th>{html.escape(c)}</th>"
                   for i, c in enumerate(df.columns))
    rows = "".join("<tr>" + "".join(f"<td class='l'>{html.escape(str(v))}</td>" if i < 4 else
                                    f"<td>{html.escape(str(v))}</td>" for i, v in enumerate(row)) + "</tr>"
                   for row in df.itertuples(index=False))
    return f"<table><tr>{head}</tr>{rows}</table>"


def table_markdown(df: pd.DataFrame) -> str:
    lines = ["| " + " | ".join(df.columns) + " |", "|" + "---|" * len(df.columns)]
    lines += ["| " + " | ".join(str(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join(lines)


def _cells(runs: pd.DataFrame, epochs: pd.DataFrame, steps: pd.DataFrame) -> list[dict]:
    out = []
    for r in runs.sort_values("cell_id").to_dict("records"):
        wall = r.get("child_wall_s")
        out.append({
            "cell_id": r["cell_id"], "status": r["status"], "error": r.get("error") or "",
            "stderr_tail": r.get("stderr_tail") or "", "amp_api": r.get("amp_api") or "",
            "epochs": int((epochs["cell_id"] == r["cell_id"]).sum()) if not epochs.empty else 0,
            "steps": int((steps["cell_id"] == r["cell_id"]).sum()) if not steps.empty else 0,
            "wall": f"{wall:.1f}" if isinstance(wall, float) and pd.notna(wall) else "",
        })
    return out


def render_report(run_dir: Path) -> Path:
    run_dir = Path(run_dir)
    manifest = load_manifest(run_dir)
    tables = records.read_run(run_dir)
    runs, epochs, steps = tables["run"], tables["epochs"], tables["steps"]
    records.export_tables(run_dir, tables)
    figures = make_figures(runs, epochs, steps, run_dir / "figures")
    environment = manifest["environment"]
    summary = formatted_summary(summary_table(runs))
    sentences = findings(runs, steps, environment)
    ok_ids = set(runs.loc[runs["status"] == "ok", "cell_id"]) if not runs.empty else set()
    missing = [c for c in manifest["cells"] if c not in ok_ids]
    device_names = ", ".join(sorted(set(runs.get("device_name", pd.Series(dtype=str)).dropna()) - {""})) or "?"
    env_rows = [(k, environment[k]) for k in sorted(environment)]
    for col in ("framework_version", "keras_version", "device_name", "memory_kind"):
        if col in runs:
            for fw, values in runs.groupby("framework")[col]:
                vals = sorted({str(v) for v in values.dropna() if str(v)})
                if vals:
                    env_rows.append((f"{fw}: {col}", ", ".join(vals)))
    page = _env().get_template("report.html").render(
        run_id=manifest["run_id"], env=environment, device=manifest["device"], device_names=device_names,
        n_ok=len(ok_ids), n_cells=len(manifest["cells"]), missing=missing, sections=SECTIONS,
        summary_html=table_html(summary), findings=sentences, cpu_verdict=cpu_half_precision_verdict(environment),
        figures=figures, warmup=manifest["defaults"]["warmup_steps"], cells=_cells(runs, epochs, steps),
        env_rows=env_rows, command=manifest["command"],
    )
    records.atomic_write_text(run_dir / "index.html", page)
    md = [f"## amp-compare `{manifest['run_id']}` ({environment.get('cpu_model', '')}, {manifest['device']})", "",
          table_markdown(summary), "", *[f"- {s}" for s in sentences]]
    if missing:
        md += ["", f"Missing or failed cells: {', '.join(missing)}."]
    md += ["", f"Reproduce: `{manifest['command']}`", ""]
    records.atomic_write_text(run_dir / "summary.md", "\n".join(md))
    render_runs_index(run_dir.parent)
    return run_dir / "index.html"


def render_runs_index(reports_dir: Path) -> Path:
    """reports/index.html: every compare run in the folder with its headline numbers."""
    rows = []
    for run_dir in sorted((p for p in Path(reports_dir).iterdir() if (p / "manifest.json").exists()), reverse=True):
        try:
            manifest = load_manifest(run_dir)
            runs = pd.read_csv(run_dir / "data" / "run.csv") if (run_dir / "data" / "run.csv").exists() else None
        except (OSError, ValueError, pd.errors.ParserError):
            continue
        table = summary_table(runs) if runs is not None and not runs.empty else pd.DataFrame()
        headline = "; ".join(f"{r.framework} {r.precision}: {r.speedup_vs_fp32:.2f}× fp32 speed, "
                             f"{r.val_accuracy:.1%} acc." for r in table.itertuples() if r.precision != "fp32")
        m = manifest["matrix"]
        rows.append({
            "run_id": manifest["run_id"], "timestamp": manifest["environment"].get("timestamp", ""),
            "machine": f"{manifest['environment'].get('cpu_model', '')} / {manifest['device']}",
            "matrix": " × ".join(",".join(map(str, m[k])) for k in ("frameworks", "models", "datasets",
                                                                      "precisions", "seeds")),
            "ok": f"{int((runs['status'] == 'ok').sum()) if runs is not None else 0}/{len(manifest['cells'])}",
            "headline": headline or "n/a",
        })
    path = Path(reports_dir) / "index.html"
    records.atomic_write_text(path, _env().get_template("index.html").render(runs=rows))
    return path
