"""The answer a report opens with (answer.py): per model and framework what to use and why, from the verdict table
alone (verdicts.choose), one line per mixed precision. Synthetic run folders (no training) and synthetic speed
trials, rendered by the same report.render a compare calls."""

import html
import io
import json

import pandas as pd

from amp_compare.contract import records
from amp_compare.harness.report import answer, glossary, render, verdicts
from amp_compare.harness.report.terminal import print_summary
from tests.test_report_sentences import write_run
from tests.test_verdicts import _trials, _verdicts

CPU_LIMITED = {"cpu_model": "Test CPU", "cpu_amp_flags": "avx512f,avx512_bf16,avx2,f16c", "cpu_bf16_hardware": True,
               "cpu_fp16_hardware": False, "cpu_isa_limits": "ONEDNN_MAX_CPU_ISA=AVX2"}


def _set(run_dir, cell_pattern: str, **values):
    """Change some cells' run records as a child or the runner would have written them."""
    for cell in (run_dir / "cells").glob(cell_pattern):
        run = pd.read_parquet(cell / "run.parquet")
        records.atomic_write_table(cell / "run.parquet", run.assign(**values))


def _choice(v: pd.DataFrame, fw: str) -> tuple[str, str]:
    return verdicts.choose(v[v["framework"] == fw])


def test_the_faster_precision_is_used_a_slower_one_never(tmp_path):
    run_dir = write_run(tmp_path, seeds=(0, 1))
    trials = _trials(run_dir, {("torch", "fp16"): 0.2, ("torch", "bf16"): 1.4, ("tf", "fp16"): 0.5,
                               ("tf", "bf16"): 1.0})
    v = _verdicts(run_dir, trials)
    assert _choice(v, "torch") == ("bf16", "interval_excludes_1")
    assert _choice(v, "tf") == ("fp32", "none_faster")  # one slower, one the same: nothing gained
    both = _verdicts(run_dir, _trials(run_dir, {("torch", "fp16"): 0.2, ("torch", "bf16"): 0.5, ("tf", "fp16"): 0.5,
                                                 ("tf", "bf16"): 1.0}))
    assert _choice(both, "torch") == ("fp32", "all_slower")  # said as what was measured, not as "none faster"
    assert _choice(both, "tf") == ("fp32", "none_faster")
    # the reason names its instrument: the training cells may have measured otherwise by wall time
    said = answer.render(both, "text")
    assert "PyTorch: use fp32 (every mixed precision slower in the speed trials)" in said
    assert "Keras (TF): use fp32 (none faster in the speed trials with accuracy kept)" in said


def test_a_faster_precision_that_lost_accuracy_or_diverged_is_not_used(tmp_path):
    run_dir = write_run(tmp_path, frameworks=("torch",), seeds=(0, 1))
    v = _verdicts(run_dir, _trials(run_dir, {("torch", "fp16"): 1.5, ("torch", "bf16"): 1.3}))
    lower = (v["precision"] == "fp16") & (v["metric"] == "accuracy")
    v.loc[lower, ["status", "reason"]] = ["lower", "interval_excludes_0"]
    assert _choice(v, "torch") == ("bf16", "interval_excludes_1")
    diverged = (v["precision"] == "bf16") & (v["metric"] == "numerics")
    v.loc[diverged, ["status", "reason"]] = ["failed", "diverged"]
    assert _choice(v, "torch") == ("fp32", "none_faster")


def test_a_run_without_trials_names_no_speed_and_recommends_nothing_mixed(tmp_path):
    run_dir = write_run(tmp_path, frameworks=("torch",), seeds=(0, 1))
    v = _verdicts(run_dir)
    assert _choice(v, "torch") == ("fp32", "no_trial")
    text = answer.render(v, "text")
    assert "PyTorch: use fp32 (no trial)" in text and "speed n/a" in text
    assert "×" not in text  # no wall-time ratio stands in for a speed verdict


def test_a_run_that_kept_the_frameworks_from_instructions_says_so_first(tmp_path):
    run_dir = write_run(tmp_path, frameworks=("torch",), seeds=(0,))
    first = answer.preface(CPU_LIMITED)
    assert first and "limit" in first
    assert answer.render(_verdicts(run_dir), "text", first).startswith(first)


def test_a_cpu_without_half_arithmetic_is_named_before_the_answer():
    """The flags the run recorded (cpu_bf16_hardware, cpu_fp16_hardware) name the formats this CPU has no arithmetic
    for; a GPU run and a CPU with both say nothing."""
    env = {"cpu_bf16_hardware": True, "cpu_fp16_hardware": False}
    assert answer.preface(env, "cpu") == "This CPU's flags list no float16 arithmetic."
    assert answer.preface({**env, "cpu_fp16_hardware": False, "cpu_bf16_hardware": False}, "cpu") == (
        "This CPU's flags list no bfloat16 or float16 arithmetic.")
    assert answer.preface({"cpu_bf16_hardware": True, "cpu_fp16_hardware": True}, "cpu") == ""
    assert answer.preface({"cpu_bf16_hardware": False, "cpu_fp16_hardware": False}, "cuda") == ""


def test_a_precision_far_slower_than_fp32_is_named_before_the_answer_with_where_its_kernels_are_named():
    """A speed verdict whose interval stays at or below answer.FAR_SLOWER (seen: float16 convolutions 40-95x slower on
    a Xeon whose flags list float16 arithmetic) opens the answer; a merely slower one does not."""
    both = {"cpu_bf16_hardware": True, "cpu_fp16_hardware": True}
    rows = pd.DataFrame([{"metric": "speed", "framework": f, "model": "simple_cnn", "precision": p, "status": "slower",
                          "estimate": e, "high": h} for f, p, e, h in (("tf", "fp16", 0.0105, 0.013),
                                                                       ("torch", "fp16", 0.024, 0.029),
                                                                       ("torch", "bf16", 0.38, 0.41))])
    # the lab audit: "fp16, fp16-noscale and fp16-static 96–98× slower" read as every framework's and model's
    assert answer.preface(both, "cpu", rows) == ("Keras (TF) simple_cnn fp16 95× and PyTorch simple_cnn fp16 42× "
                                                 "slower than fp32 in the speed trials; this run recorded no profile: "
                                                 "rerun with --profile to name the kernels.")
    assert answer.preface(both, "cpu", rows, profiled=True).endswith("the Profile section names the kernels.")
    assert answer.preface(both, "cpu", rows.assign(high=rows["high"] + 0.1)) == ""


def test_the_page_summary_and_terminal_open_with_the_same_answer(tmp_path):
    run_dir = write_run(tmp_path, seeds=(0, 1))
    rendered = render.render(run_dir, figures=False)
    page = html.unescape((run_dir / "index.html").read_text())
    md = (run_dir / "summary.md").read_text()
    from rich.console import Console

    console = Console(width=80, file=io.StringIO(), color_system=None)
    print_summary(console, "t", rendered)
    terminal = console.file.getvalue()
    expanded = glossary.expand_first_use  # an abbreviation is written out at its first use on the page
    for line in rendered.answer.splitlines():
        assert line.strip() in terminal
        assert line.strip() in page or expanded(line.strip())[0] in page
        assert line.strip() in md or expanded(line.strip(), markdown=True)[0] in md
    assert page.index('id="answer"') < page.index("<details")  # the answer first; the rest one click away


def test_the_default_shaped_run_fits_an_80_by_40_terminal(tmp_path):
    # the default run's shape: two models, two frameworks, fp32 and two mixed precisions
    run_dir = write_run(tmp_path / "a", seeds=(0, 1, 2))
    other = write_run(tmp_path / "b", seeds=(0,), model="vit")
    ratios = {("torch", "fp16"): 0.156, ("torch", "bf16"): 0.167, ("tf", "fp16"): 0.455, ("tf", "bf16"): 0.16}
    v = pd.concat([_verdicts(run_dir, _trials(run_dir, ratios)), _verdicts(other, _trials(other, ratios))],
                  ignore_index=True)  # with speed trials: the answer's longest lines
    # the table's longest cells: every ratio and memory verdict undecided (a ViT's one seed, a wide trial)
    v = v.assign(status=v["status"].where(~v["metric"].isin(["speed", "memory", "time_to_target"]), "undecided"))
    from rich.console import Console

    console = Console(width=80, file=io.StringIO(), color_system=None)
    print_summary(console, "amp-compare summary (r)", render.Rendered(run_dir / "index.html", None, [],
                                                                        answer=answer.render(v, "text"), verdicts=v))
    lines = console.file.getvalue().splitlines()
    assert len(lines) <= 40 and max(map(len, lines[:-1])) <= 80  # the last: the report's path, whole
    assert "…" not in "\n".join(lines)  # nothing cut
    assert max(map(len, answer.render(v, "text").splitlines())) <= 80  # no answer line wrapped


def test_fp8_on_a_cpu_has_no_speed_or_memory_verdict(tmp_path):
    run_dir = write_run(tmp_path, frameworks=("torch",), precisions=("fp32", "bf16", "fp8"), seeds=(0,),
                        model="vit")
    t = records.read_run(run_dir)
    from amp_compare.harness.report.tables import full_table

    full = full_table(t["run"], t["epochs"], {"device": "cpu"})
    trials = _trials(run_dir, {("torch", "bf16"): 1.3, ("torch", "fp8"): 2.0}).assign(model="vit")
    v = verdicts.build(full, t["run"], trials)
    fp8 = v[v["precision"] == "fp8"].set_index("metric")
    assert fp8.loc["speed", "reason"] == fp8.loc["memory", "reason"] == "emulated"
    # the trial timed the emulation too: its ratio is printed nowhere ("0.25× n/a" in the terminal, audit)
    assert pd.isna(fp8.loc["speed", "estimate"]) and pd.isna(fp8.loc["speed", "low"])
    assert verdicts.choose(v)[0] == "bf16"  # an emulation's time never recommends fp8


FP8_RECIPE = {"scaling": "dynamic", "granularity": "tensor", "amax_history": 1, "power_of_2_scales": False,
              "module": "torchao.float8.float8_linear.Float8Linear",
              "formats": ["float8_e4m3fn", "float8_e4m3fn", "float8_e5m2"], "converted": ["fc1", "fc2"]}


def _fp8_run(tmp_path, wrong: int, wrong_seed_1: int | None = None):
    """A torch vit run with bf16 and fp8 cells of two seeds, the fp8 cells' recipe and per-layer SQNR recorded as a
    child records them; fp8 gets the bf16 cell's images right but `wrong` more of them wrong."""
    run_dir = write_run(tmp_path, frameworks=("torch",), precisions=("fp32", "bf16", "fp8"), seeds=(0, 1), model="vit")
    for seed in (0, 1):
        bf16 = next((run_dir / "cells").glob(f"*bf16-s{seed}"))
        correct = records.unpack_correct(pd.read_parquet(bf16 / "run.parquet")["val_correct"].iloc[0], 200)
        correct[:wrong if seed == 0 or wrong_seed_1 is None else wrong_seed_1] = False
        _set(run_dir, f"*fp8-s{seed}", fp8_settings=json.dumps(FP8_RECIPE), val_correct=records.pack_correct(correct))
        cell = next((run_dir / "cells").glob(f"*fp8-s{seed}"))
        ident = pd.read_parquet(cell / "run.parquet")[["run_id", "cell_id", "framework", "model", "dataset",
                                                       "precision", "seed"]].iloc[0].to_dict()
        layers = pd.DataFrame([{**ident, "layer": layer, "role": role, "format": "e4m3", "when": when, "step": 0,
                                "amax": 1.0,
                                "sqnr_db": 12.0 if (layer, role, when) == ("fc2", "grad_output", "last step") else
                                30.0 + seed, "zero_share": 0.0}
                               for layer in ("fc1", "fc2") for role in ("input", "kernel", "grad_output")
                               for when in ("first step", "last step")])
        records.atomic_write_table(cell / "fp8_layers.parquet", layers)
    return render.render(run_dir, figures=False)


def test_an_fp8_run_answers_with_its_recipe_sqnr_and_accuracy_against_bf16(tmp_path):
    """Issue: the fp8 report's answer says how the recipe scales and what that did to SQNR and accuracy against bf16
    (verdicts.FP8, fp8.verdict_rows, phrases._fp8), before the speed lines."""
    same = _fp8_run(tmp_path / "same", wrong=0)
    row = same.verdicts[same.verdicts["metric"] == "fp8_vs_bf16"].iloc[0]
    assert (row.status, row.reason) == ("same", "no_image_differed")  # paired against bf16, not fp32
    text = same.answer
    assert text.index("fp8 against bf16 (what this run asks)") < text.index("fp8: speed")
    assert ("PyTorch fp8: 2 layers in fp8, scaled by each step's own amax, one scale per tensor; median SQNR at the "
            "last step (over layers and seeds): input 30.5, kernel 30.5, output gradient 21.0 dB; accuracy against "
            "bf16 (2 seeds paired) +0.0 pp") in text
    page = (same.index.parent / "index.html").read_text()  # the section names the API each cell recorded
    assert ("as its cells recorded it: PyTorch fp8: torchao.float8.float8_linear.Float8Linear on 2 layers, dynamic "
            "scaling") in page
    lower = _fp8_run(tmp_path / "lower", wrong=60).verdicts
    assert lower[lower["metric"] == "fp8_vs_bf16"].iloc[0].status == "lower"
    # the fp8 section's table: one row per seed, each with its own seed's pairing (audit: the pooled difference was
    # repeated on every seed's row)
    from amp_compare.harness.report import fp8 as fp8_report

    mixed = _fp8_run(tmp_path / "mixed", wrong=60, wrong_seed_1=0)
    table = fp8_report.section(records.read_run(mixed.index.parent), "cpu")["table"].set_index("seed")
    column = table["acc. − bf16, this seed [interval]"]
    assert column[0].startswith("-29.0 pp [") and column[1].startswith("+0.0 pp ["), column


def test_a_precision_its_framework_cannot_run_is_one_word_not_a_failure_per_metric(tmp_path):
    """Audit: "fp8-rowwise: speed failed (unavailable here); accuracy failed (unavailable here)" for cells that were
    never run (Keras has no rowwise recipe)."""
    v = _verdicts(write_run(tmp_path, frameworks=("torch",), seeds=(0, 1)))
    v.loc[v["precision"] == "fp16", ["status", "reason"]] = ["failed", "unavailable"]
    text = answer.render(v, "text")
    assert "    fp16: unavailable here\n" in text + "\n" and "failed" not in text, text
    from amp_compare.harness.report import phrases

    cells = phrases.table(v).set_index("Precision").loc["fp16"]
    assert set(cells.drop("Framework")) == {"unavailable here"}, cells  # the tables: not "failed" either


def test_the_fp8_scale_trace_keeps_per_tensor_recipes_and_each_seed_apart():
    """Audit: the scale figure joined two seeds into one line and drew a per-row recipe's per-tensor fmax / amax,
    a scale that recipe never applies."""
    from amp_compare.harness.report import fp8 as fp8_report

    trace = pd.DataFrame([{"cell_id": f"{fw}-{p}-s{seed}", "framework": fw, "precision": p, "seed": seed,
                           "layer": "fc1", "role": "input", "step": step + 1, "amax": 1.0, "scale": 448.0}
                          for fw, p in (("torch", "fp8"), ("torch", "fp8-rowwise"), ("tf", "fp8"))
                          for seed in (0, 1) for step in range(3)])
    kept = fp8_report._from_zero(trace)
    assert set(kept["precision"]) == {"fp8"} and kept["step"].min() == 0
    assert kept.groupby(["framework", "seed"]).size().to_dict() == {("tf", 0): 3, ("tf", 1): 3, ("torch", 0): 3,
                                                                    ("torch", 1): 3}
