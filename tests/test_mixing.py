"""No table or figure of a report mixes two models (issue 32): a two-model run from synthetic tables, rendered with
its figures by the same report.render a compare calls; every table of the page names the model in a column (or
does not depend on the model), and the figures that draw per-model numbers draw them apart."""

import re

from amp_compare.contract import records
from amp_compare.harness.report import render
from tests.test_report_sentences import write_run

# tables that describe no cell's numbers: the environment, the framework differences, the settings both used
MODEL_FREE = ("Framework differences", "Environment", "Settings")


def _two_models(tmp_path):
    """write_run's simple_cnn run plus a copy of every cell as the vit, 3x slower and with other gradients."""
    run_dir = write_run(tmp_path, seeds=(0,), speeds={("torch", "bf16"): [1.3], ("tf", "fp16"): [0.2]})
    for cell in list((run_dir / "cells").iterdir()):
        vit = run_dir / "cells" / cell.name.replace("simple_cnn", "vit")
        tables = records.read_cell(cell)
        for name, t in tables.items():
            t = t.assign(cell_id=t["cell_id"].str.replace("simple_cnn", "vit"), model="vit") if "model" in t else t
            if name == "run":
                t = t.assign(throughput_img_s=t["throughput_img_s"] / 3, cfg_model="vit")
            if name == "steps":
                t = t.assign(step_time_s=t["step_time_s"] * 3)
            if name == "underflow":
                t = t.assign(elements=t["elements"] * 10)
            tables[name] = t
        records.write_cell(vit, tables)
    manifest = render.load_manifest(run_dir)
    manifest["matrix"]["models"] = ["simple_cnn", "vit"]
    manifest["cells"] += [c.replace("simple_cnn", "vit") for c in manifest["cells"]]
    (run_dir / "manifest.json").write_text(__import__("json").dumps(manifest))
    return run_dir


def test_every_table_and_figure_keeps_the_two_models_apart(tmp_path):
    run_dir = _two_models(tmp_path)
    rendered = render.render(run_dir, figures=False)  # the figures that draw per-model numbers: below, alone
    page = (run_dir / "index.html").read_text()
    # the per-model verdict tables: their title names the model
    titled = re.findall(r"<h3>(?:simple_cnn|vit) on synthetic</h3>\s*(<table>.*?</table>)", page, flags=re.S)
    assert len(titled) == 2, re.findall(r"<h3>[^<]*</h3>", page)
    for table in re.findall(r"<table>.*?</table>", page, flags=re.S):
        head = re.findall(r"<th[^>]*>(.*?)</th>", table.split("</tr>")[0])
        per_cell = {"Framework", "Precision"} <= set(head)
        if per_cell and table not in titled and not any(h in table for h in MODEL_FREE):
            assert "Model" in head, head  # a framework x precision row must say whose model it is
    timing = re.search(r"<table><tr><th class='l'>Model</th>.*?p50 step \(ms\).*?</table>", page, flags=re.S)
    assert timing and "vit" in timing.group(0) and "simple_cnn" in timing.group(0)
    table = rendered.table.set_index(["model", "framework", "precision"])
    assert table.loc[("vit", "torch", "fp32"), "throughput_img_s"] < table.loc[("simple_cnn", "torch", "fp32"),
                                                                               "throughput_img_s"] / 2
    underflow = re.search(r"<table>.*?Gradient elements.*?</table>", page, flags=re.S).group(0)
    assert "20,000" in underflow and "2,000" in underflow and "22,000" not in underflow
    answer = page[page.index('id="answer"'):page.index("</div>", page.index('id="answer"'))]
    assert answer.count("<b>simple_cnn on synthetic") == 1 and answer.count("<b>vit on synthetic") == 1
    assert answer.count("PyTorch: use") == 2  # one line per model x framework
    from amp_compare.harness.report import figures

    t = records.read_run(run_dir)
    hist = __import__("amp_compare.harness.report.numerics", fromlist=["x"]).gradient_histogram(t["underflow"])
    assert set(hist["model"]) == {"simple_cnn", "vit"}
    assert figures.make_gradient_histogram_figure(t["underflow"], run_dir / "figures") is not None


def test_numerics_sentences_captions_and_the_max_batch_table_keep_the_two_models_apart(tmp_path):
    import pandas as pd

    from amp_compare.harness.report import numerics as nr

    t = records.read_run(_two_models(tmp_path))
    # the vit's copy of every cell carries 10x the gradient elements: a pooled count would read 11,000 / 22,000
    lost = nr.lost_sentences(t["underflow"])
    assert len(lost) == 4 and sum(s.startswith("vit, ") for s in lost) == 2, lost
    assert not any("11,000" in s or "22,000" in s for s in lost)
    head = nr.headroom_sentences(t["underflow"])
    assert len(head) == 4 and {s.split(",")[0] for s in head} == {"simple_cnn", "vit"}
    runs = pd.concat([t["run"], t["run"][t["run"]["precision"] == "fp16"].assign(
        precision="fp16-noscale", final_val_accuracy=lambda d: d["final_val_accuracy"] - 0.5 * (d["model"] == "vit"))])
    said = nr.scaling_accuracy_sentences(runs)
    assert len(said) == 4 and any(s.startswith("vit, PyTorch") for s in said), said
    # the lab audit: cells the speed budget stopped are not the run's accuracy, nor "tested against fp32"
    cut = runs.assign(budget_steps=[40 if m == "simple_cnn" and p.startswith("fp16") else None
                                    for m, p in zip(runs["model"], runs["precision"])])
    cut = cut.astype({"budget_steps": "Int64"})
    assert [s.split(",")[0] for s in nr.scaling_accuracy_sentences(cut)] == ["vit"] * 2
    # the second lab audit: one cut seed leaves its precision out, not its other seeds' median
    two = pd.concat([runs, runs.assign(seed=1, cell_id=runs["cell_id"] + "-1")], ignore_index=True)
    one = two.assign(budget_steps=[40 if m == "simple_cnn" and p == "fp16" and s == 0 else None
                                   for m, p, s in zip(two["model"], two["precision"], two["seed"])])
    one = one.astype({"budget_steps": "Int64"})
    assert [s.split(",")[0] for s in nr.scaling_accuracy_sentences(one)] == ["vit"] * 2
    steps = t["steps"].assign(precision=t["steps"]["precision"].replace("bf16", "fp16-static"))
    from amp_compare.harness.report import figures

    caption = figures._loss_scale_figures(steps, tmp_path)[0].caption
    assert "vit PyTorch fp16: 0 of 200 steps skipped in 1 run" in caption, caption
    assert "of 400 steps" not in caption  # two models' steps never counted together
    probes = pd.DataFrame([{"framework": "torch", "model": m, "dataset": "synthetic", "precision": "fp32",
                            "probe": 0, "batch": b, "ok": True, "peak_bytes": 2**20 * b, "cap_bytes": None,
                            "max_ok": b, "first_failed": None} for m, b in (("simple_cnn", 512), ("vit", 64))])
    table = render._maxbatch_table(probes)
    assert list(table["Model"]) == ["simple_cnn", "vit"] and list(table["Largest batch that fit"]) == ["512", "64"]
