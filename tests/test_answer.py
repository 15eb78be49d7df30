"""The answer a report opens with (issue 32): per model and framework, what to use on this machine and why, from
the run's evidence only, and what would decide what the run cannot. Synthetic run folders (no training) rendered
by the same report.render a compare calls; the answer is read from the page, summary.md and the terminal text."""

import html

import pandas as pd

from amp_compare.contract import records
from amp_compare.harness.report import answer, glossary, render
from amp_compare.harness.report.per_seed import seed_table
from amp_compare.harness.report.tables import full_table
from tests.test_report_sentences import make_run, write_run

CPU_BF16 = {"cpu_model": "Test CPU", "cpu_amp_flags": "avx512f,avx512_bf16,avx2,f16c", "cpu_bf16_hardware": True,
            "cpu_fp16_hardware": False}
NOTICE = ("oneDNN supports DT_HALF only on platforms with AVX-512. Falling back to the default Eigen-based "
          "implementation")


def _set(run_dir, cell_pattern: str, **values):
    """Change some cells' run records as a child or the runner would have written them."""
    for cell in (run_dir / "cells").glob(cell_pattern):
        run = pd.read_parquet(cell / "run.parquet")
        records.atomic_write_table(cell / "run.parquet", run.assign(**values))


def _set_steps(run_dir, cell_pattern: str, skipped_at=(), nonfinite_from=()):
    """Some cells' step records as a run that skipped and then diverged writes them."""
    for cell in (run_dir / "cells").glob(cell_pattern):
        steps = pd.read_parquet(cell / "steps.parquet")
        steps.loc[steps["step"].isin(skipped_at), "skipped"] = True
        steps.loc[steps["step"].isin(nonfinite_from), "loss"] = float("nan")
        records.atomic_write_table(cell / "steps.parquet", steps)


def _answers(run_dir, profile=None, cpu=CPU_BF16):
    manifest = render.load_manifest(run_dir)
    manifest["environment"].update(cpu)
    t = records.read_run(run_dir)
    env = {**manifest["environment"], "calibrations": manifest["calibrations"]}
    full = full_table(t["run"], t["steps"], t["epochs"], env)
    return answer.answers(full, seed_table(t["run"], t["steps"], env), t["run"], manifest["environment"], "cpu",
                          profile, steps=t["steps"])


def test_a_win_a_loss_an_undecided_ratio_and_a_diverged_precision(tmp_path):
    speeds = {("torch", "fp16"): [0.12, 0.11, 0.13], ("torch", "bf16"): [1.30, 1.25, 1.35],
              ("tf", "fp16"): [0.80, 1.25, 1.0], ("tf", "bf16"): [1.2] * 3}
    run_dir = write_run(tmp_path, speeds=speeds)
    _set(run_dir, "tf-*-fp16-*", framework_notices=NOTICE)
    _set(run_dir, "tf-*-bf16-*", status="diverged", nonfinite_step=1, diverged_at_step=7, nonfinite_where="forward",
         nonfinite_layer="conv1", nonfinite_value="nan")
    _set_steps(run_dir, "tf-*-bf16-*", skipped_at=(1, 5, *range(7, 200)), nonfinite_from=(5, *range(7, 200)))
    torch, tf = _answers(run_dir)
    assert torch.label == "simple_cnn on synthetic, PyTorch" and torch.use == "bf16"
    fp16, bf16 = torch.parts
    assert fp16.verdict == "slower" and fp16.speed.startswith(
        "0.12× fp32's speed (geometric mean), below 1× in every seed (0.12×, 0.11×, 0.13×)")
    assert "this CPU has no float16 arithmetic (avx512_fp16/amx_fp16 absent; flags: avx512f,avx512_bf16" in fp16.why
    assert "which kernels ran is unexplained by this run (no profile)" in fp16.why
    assert bf16.verdict == "faster" and "this CPU has bfloat16 dot products" in bf16.why and not bf16.decide
    assert bf16.accuracy.startswith("no detectable accuracy change (p = ")
    assert tf.use == "fp32" and "fp16 undecided by this run" in tf.because
    tf_fp16, tf_bf16 = tf.parts
    assert tf_fp16.verdict == "undecided" and "⚠ noisy" in tf_fp16.speed and tf_fp16.decide.startswith("more seeds")
    # where it went non-finite is read from its step records: the locator's step 1 was a skipped update with a
    # finite loss, the first non-finite loss was step 5, and the run of them that stopped it began at step 7
    ending = ("diverged (steps counted from 0: first non-finite loss at step 5; the loss scaler skipped its first "
              "update at step 1, with a finite loss; non-finite from step 7 on, it was stopped after step 199)")
    assert tf_bf16.verdict == "failed" and tf_bf16.failed == ", ".join(f"seed {s} {ending}" for s in range(3))
    said = render.render(run_dir, figures=False).findings
    assert any(s.startswith("simple_cnn on synthetic, Keras (TF) bf16 (seed 0) diverged") and
               "steps counted from 0: first non-finite loss at step 5;" in s for s in said), said



def test_an_answer_on_a_run_that_kept_the_frameworks_from_instructions_says_so(tmp_path):
    """ONEDNN_MAX_CPU_ISA=AVX2 on a CPU with AVX-512 BF16 (contract/env.cpu_info records it): the flags still list
    bfloat16 dot products, and the reason beside a slowdown says the frameworks were kept from instructions."""
    run_dir = write_run(tmp_path, speeds={("torch", "fp16"): [0.12, 0.11, 0.13], ("torch", "bf16"): [0.15] * 3,
                                          ("tf", "fp16"): [0.3] * 3, ("tf", "bf16"): [0.3] * 3})
    limited = {**CPU_BF16, "cpu_isa_limits": "ONEDNN_MAX_CPU_ISA=AVX2"}
    fp16, bf16 = _answers(run_dir, cpu=limited)[0].parts
    assert fp16.why.startswith("this CPU has no float16 arithmetic (avx512_fp16/amx_fp16 absent; flags: avx512f,"
                               "avx512_bf16,avx2,f16c), and this run kept oneDNN from AVX-512 "
                               "(ONEDNN_MAX_CPU_ISA=AVX2);"), fp16.why
    assert bf16.verdict == "slower" and ("this CPU has bfloat16 dot products (flags: avx512f,avx512_bf16,avx2,f16c), "
                                         "but this run kept oneDNN from AVX-512 (ONEDNN_MAX_CPU_ISA=AVX2), so oneDNN "
                                         "could not use those instructions, whatever the flags list") in bf16.why, \
        bf16.why
    assert "this run kept" not in _answers(run_dir)[0].parts[1].why
    # the limit covers every cell, fp32's too: said once before the answers, in each format
    first = answer.preface(limited)
    assert first == ("This run kept oneDNN from AVX-512 (ONEDNN_MAX_CPU_ISA=AVX2): every cell's numbers, fp32's "
                     "included, are what the frameworks did under that limit, not this CPU's default.")
    items = _answers(run_dir, cpu=limited)
    assert all(answer.render(items, fmt, first).startswith(start) for fmt, start in
               (("html", f"<div class='answer'><p>{html.escape(first)}</p>"), ("markdown", first), ("text", first)))
    assert answer.preface(CPU_BF16) == "" and answer.render(items, "text").startswith("simple_cnn")
    # a precision whose cells all failed under the limit: the limit beside how they ended, neither blamed nor cleared
    _set(run_dir, "tf-*-bf16-*", status="failed", error="exited with code 1")
    failed = _answers(run_dir, cpu=limited)[1].parts[1]
    assert failed.verdict == "failed" and failed.failed.endswith(
        "; this run kept oneDNN from AVX-512 (ONEDNN_MAX_CPU_ISA=AVX2), and no record says whether that is why"), \
        failed.failed
    assert "this run kept" not in _answers(run_dir)[1].parts[1].failed
    both = {**CPU_BF16, "cpu_isa_limits": "ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16, ATEN_CPU_CAPABILITY=avx2"}
    assert answer.preface(both).startswith("This run kept oneDNN and PyTorch's own kernels from some of the CPU's "
                                           "instructions (ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16, ")

def test_the_why_follows_the_speed_verdict_and_no_p_is_printed_where_no_image_differed(tmp_path):
    run_dir = write_run(tmp_path, speeds={("tf", "fp16"): [0.25] * 3, ("torch", "fp16"): [0.12] * 3})
    _set(run_dir, "tf-*-fp16-*", framework_notices=NOTICE)
    same = pd.read_parquet(next((run_dir / "cells").glob("tf-*-fp32-s0")) / "run.parquet")["val_correct"].iloc[0]
    _set(run_dir, "tf-*", val_correct=same)  # every Keras cell got every image right or wrong as fp32 did
    page = render.render(run_dir, figures=False).answer
    line = next(ln for ln in page.split("Keras (TF): use")[1].splitlines() if "fp16:" in ln)
    speed, why = line.index("fp32's speed"), line.index("— why:")
    said = line.index("Every image was classified right or wrong")
    assert speed < why < line.index("peak memory") and why < said, line
    # the framework's line is quoted as its record of the path it took, with nothing read into it and no
    # "unexplained" beside it; the CPU's flags stand beside it as flags
    assert "logged “oneDNN supports DT_HALF only on platforms with AVX-512. Falling back to the default Eigen-based " \
           "implementation” (its own record of the path it took); this CPU has no float16 arithmetic " \
           "(avx512_fp16/amx_fp16 absent; flags: " in line, line
    assert "it names is" not in line and "unexplained" not in line.split("fp16:")[1].split("bf16:")[0], line
    # the records hold right/wrong per image, not the class: the sentence says no more than that
    assert "Every image was classified right or wrong exactly as in fp32 (exact 95% bound ±" in line, line
    assert "predicted" not in line and "p =" not in line, line


def test_the_reason_comes_from_the_framework_log_and_a_profile_when_the_run_has_them(tmp_path):
    run_dir = write_run(tmp_path, speeds={("tf", "fp16"): [0.25] * 3, ("torch", "fp16"): [0.12] * 3})
    _set(run_dir, "tf-*-fp16-*", framework_notices=NOTICE)
    profile = pd.DataFrame([{"framework": "torch", "model": "simple_cnn", "precision": "fp16", "op":
                             "aten::convolution_backward", "self_share": 0.61, "library_path": "oneDNN ref:any"},
                            {"framework": "torch", "model": "simple_cnn", "precision": "fp16", "op": "aten::add_",
                             "self_share": 0.05, "library_path": "native"}])
    torch, tf = _answers(run_dir, profile)
    assert "in its profile, aten::convolution_backward accounts for 61% of the step-time difference against fp32 " \
           "(library: oneDNN ref:any)" in \
        torch.parts[0].why and "unexplained" not in torch.parts[0].why
    assert f"Keras (TF) logged “{NOTICE}”" in tf.parts[0].why


def test_one_seed_and_a_speed_budget_say_what_a_full_measurement_needs(tmp_path):
    run_dir = write_run(tmp_path, seeds=(0,), speeds={("torch", "fp16"): [0.12], ("torch", "bf16"): [1.3]},
                        frameworks=("torch",))
    _set(run_dir, "torch-*-fp16-*", budget_steps=40, budget_reason="first steps over 5× fp32's")
    (torch,) = _answers(run_dir)
    fp16, bf16 = torch.parts
    # one seed: its interval is one cell pair's step noise, said beside it, in three significant digits; never
    # a verdict free of ⚠, and the advice is more seeds, not "the seeds' ratios disagree"
    assert bf16.speed.startswith("1.30× fp32's speed in seed 0 [") and "(95% interval of the step-to-step noise " \
        "within seed 0's two cells only; how the ratio varies between seeds is unknown) ⚠ one seed" in bf16.speed
    assert bf16.verdict == "undecided" and bf16.decide == "more seeds (a run with --seeds 0,1,2 given explicitly)"
    assert fp16.speed.startswith("0.120× fp32's speed in seed 0 [0.1") and "disagree" not in fp16.decide
    assert fp16.budget == ("its speed was measured over 40 steps only (speed budget: first steps over 5× fp32's); "
                           "--no-speed-budget measures it in full")


def test_the_page_summary_and_terminal_open_with_the_same_answer(tmp_path):
    rendered, page = make_run(tmp_path, speeds={("torch", "fp16"): [0.12, 0.11, 0.13]})
    first = "simple_cnn on synthetic, PyTorch: use fp32"
    assert page.index("Answer: what to use on this machine") < page.index('<h2 id="summary">')
    assert first in page and rendered.answer.startswith(first)
    md = (tmp_path / "r" / "summary.md").read_text()
    assert md.index("### Answer") < md.index("| Framework") and first in md
    line = next(ln for ln in rendered.answer.splitlines() if "fp16: 0.12×" in ln).strip("- ").rstrip(".")
    # the page and summary.md write each abbreviation out at its first use, which is now in the answer (summary.md
    # lists one used only inside a parenthesis at its end, not in the line)
    md_line = glossary.expand_first_use(line, markdown=True)[0].split("\n\nAbbreviations:")[0]
    assert glossary.expand_first_use(line)[0] in page and md_line in md


def test_fp8_on_a_cpu_has_no_speed_result_anywhere_and_its_answer_speaks_of_numerics(tmp_path):
    from tests.test_report_sentences import make_run, section

    rendered, page = make_run(tmp_path, frameworks=("torch",), precisions=("fp32", "bf16", "fp8"), seeds=(0, 1),
                              model="vit", speeds={("torch", "fp8"): [0.3, 0.31], ("torch", "bf16"): [1.3, 1.31]})
    md = (tmp_path / "r" / "summary.md").read_text()
    for text in (page, md, rendered.answer):
        assert "0.30×" not in text and "0.31×" not in text and "nan×" not in text  # no fp8 ratio, no verdict
    row = rendered.table.set_index("precision").loc["fp8"]
    assert row["speed_note"] == "emulated: not a speed result" and row["speedup_vs_fp32"] != row["speedup_vs_fp32"]
    fp8_line = next(ln for ln in rendered.answer.splitlines() if ln.strip().startswith("- fp8:"))
    assert "emulated: not a speed result" in fp8_line and "validation loss +0.0100 against fp32" in fp8_line
    assert "against bf16" in fp8_line and "this run cannot decide" not in fp8_line
    assert "use bf16" in rendered.answer  # bf16's measured gain still decides; fp8 is never recommended
    assert "fp8 emulated: not a speed result (1," in page  # the speed findings
    assert "<td>emulated: not a speed result</td><td>n/a</td><td>n/a</td>" in section(page, "speed")
    assert "| fp8 | 2 |" in md and "| emulated: not a speed result |" in md



def test_seeds_spread_by_the_machines_drift_ask_for_the_interleaved_benchmark_not_more_seeds(tmp_path):
    """Audit: PyTorch bf16's seeds disagreed because seed 1's bf16 cell ran on a machine 1.5x slower (its checks
    read 4.5 ms against 3.0 ms), yet the answer said "noisy … more seeds" and the summary counted no drift flag."""
    from amp_compare.contract.config import RunConfig
    from amp_compare.harness.run.order import interleaved_order

    cells = interleaved_order([RunConfig(framework=fw, precision=p, seed=s, dataset="synthetic", epochs=3)
                               for s in (0, 1, 2) for p in ("fp32", "fp16", "bf16") for fw in ("torch", "tf")])
    slow = "torch-simple_cnn-synthetic-bf16-s1"
    checks = [{"when": "before the matrix", "ms": 3.0, "spread": 0.04}] + [
        {"when": f"after {c.cell_id}", "ms": 4.5 if c.cell_id == slow else 3.0 + 0.01 * (i % 3), "spread": 0.04}
        for i, c in enumerate(cells)]
    run_dir = write_run(tmp_path, speeds={("torch", "bf16"): [1.6, 0.7, 1.2]}, calibrations=checks)
    torch = next(a for a in _answers(run_dir) if a.label.endswith("PyTorch"))
    bf16 = next(p for p in torch.parts if p.precision == "bf16")
    assert "⚠ machine drift could explain it (seed 1: 0.70× within" in bf16.speed and "; also noisy" in bf16.speed
    assert bf16.verdict == "undecided" and bf16.decide == answer.DECIDE["machine drift"]
    said = render.render(run_dir, figures=False).findings
    flagged = next(s for s in said if "speed ratios are marked ⚠" in s)
    assert "1 for the machine's own drift" in flagged and "benchmarks/amp_speed.py" in flagged


def test_a_failed_precision_says_the_error_it_recorded_not_the_locator(tmp_path):
    """A cell that failed with an error (an XLA CPU kernel missing) is no numerical failure: its answer quotes the
    exception line of its recorded stderr, and sends no one to the NaN/Inf locator, which has nothing on it."""
    run_dir = write_run(tmp_path, speeds={("tf", "fp16"): [0.8] * 3, ("torch", "fp16"): [0.9] * 3})
    tail = "Traceback ...\nValueError: The precision 'F16_F16_F32' is not supported by dot_general on CPU\n---"
    _set(run_dir, "tf-*-fp16-*", status="failed", error="exited with code 1", stderr_tail=tail)
    tf = next(a for a in _answers(run_dir) if "Keras (TF)" in a.label)
    fp16 = tf.parts[0]
    assert fp16.verdict == "failed" and "ValueError: The precision 'F16_F16_F32' is not supported" in fp16.failed
    assert "locator" not in fp16.decide


def test_emulated_fp8_withholds_memory_says_one_seed_and_names_its_brackets(tmp_path):
    """Audit: an emulated fp8's memory (float32 dequantized copies) was compared with fp32's as if it were fp8's;
    its one-seed loss difference read as a result; its accuracy brackets said "95% CI" without their kind."""
    from tests.test_report_sentences import make_run, section

    rendered, page = make_run(tmp_path, frameworks=("torch",), precisions=("fp32", "bf16", "fp8"), seeds=(0,),
                              model="vit", speeds={("torch", "fp8"): [0.3], ("torch", "bf16"): [1.3]})
    md = (tmp_path / "r" / "summary.md").read_text()
    row = rendered.table.set_index("precision").loc["fp8"]
    assert row["memory_note"] == "emulated: not fp8 memory (float32 dequantized copies)"
    assert row["memory_change_vs_fp32"] != row["memory_change_vs_fp32"]  # NaN: no ratio
    assert "| emulated: not fp8 memory (float32 dequantized copies) |" in md
    assert "peak memory of fp8: not compared with fp32, emulated: not fp8 memory" in page
    fp8_line = next(ln for ln in rendered.answer.splitlines() if ln.strip().startswith("- fp8:"))
    assert "against fp32 (one seed: one reading, no interval)" in fp8_line and "peak memory" not in fp8_line
    fp8 = section(page, "fp8")
    assert "so each SQNR measures the fp8 casts' rounding alone" in fp8 and "no speed, memory or MFU" in fp8
    assert "[95% Newcombe " in fp8 or "[exact 95% bound " in fp8
    assert "95% CI" not in fp8 and "loss − fp32 (this seed)" in fp8
    assert "leaves fp8 out" in fp8


def test_a_seed_just_above_one_is_not_printed_as_one():
    """The audit's "above 1× in every seed (1.00×, 1.21×, 1.28×)": a seed of 1.001 read as no change."""
    assert [answer._off_one(v) for v in (1.001, 0.9996, 1.21, 1.0)] == ["1.001", "0.9996", "1.21", "1.00"]
