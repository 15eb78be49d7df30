"""Every statement true for the run (issue 32 item 4) and readable (item 5): each test here guards one kind of
false or unreadable sentence, through the functions a render calls, on synthetic tables (no training)."""

import pandas as pd

from amp_compare.harness.report import glossary, speed, stats, tables
from amp_compare.harness.report.findings import finding_parts
from tests.test_summary import _cells, _runs

AVX512_BF16 = {"cpu_model": "Test CPU", "cpu_amp_flags": "avx512f,avx512_bf16,f16c", "cpu_bf16_hardware": True,
               "cpu_fp16_hardware": False}
FP16_HW = {"cpu_model": "Test CPU", "cpu_amp_flags": "avx512f,avx512_bf16,avx512_fp16", "cpu_bf16_hardware": True,
           "cpu_fp16_hardware": True}


def test_warm_up_figures_are_in_ms_and_never_round_to_zero():
    assert tables.milliseconds(0.0031) == "3.1" and tables.milliseconds(0.0004) == "0.40"
    assert tables.milliseconds(1.234) == "1,234" and tables.milliseconds(float("nan")) == "n/a"


def test_the_epoch_time_figure_is_said_lower_or_higher_per_row():
    assert speed.relation(79.0, 100.0) == "21% lower" and speed.relation(103.0, 100.0) == "3% higher"
    assert speed.relation(100.2, 100.0) == "equal (within 0.5%)"
    assert "lower still" not in speed.timing_paragraph(5)
    # the timed steps are not an epoch (an epoch holds the warm-up and tracing too): the paragraph says which is which
    assert "user's epoch" not in speed.timing_paragraph(5) and "epoch-time column" in speed.timing_paragraph(5)


def test_the_findings_do_not_read_the_flags_as_what_the_kernels_computed():
    said = " ".join(finding_parts(_runs(), pd.DataFrame(), FP16_HW))
    assert "computes both bfloat16 and float16 in hardware" not in said



def test_a_run_that_kept_the_frameworks_from_instructions_does_not_read_the_flags_as_what_they_used(monkeypatch):
    """ONEDNN_MAX_CPU_ISA=AVX2 on a CPU with AVX-512 BF16 (a way to see another CPU's kernels on this one, e.g. a
    bf16 matmul timed at 0.0009 TFLOP/s): the flags still list bfloat16 arithmetic, but the frameworks could not
    use it, so no sentence reads the flags as explaining a slowdown or as evidence for the lesson."""
    from amp_compare.contract import env
    from amp_compare.harness.report import answer

    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    for var in ("DNNL_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY"):
        monkeypatch.delenv(var, raising=False)
    info = env.cpu_info("model name\t: Test CPU\nflags\t\t: avx2 avx512f avx512_bf16 f16c\n")
    assert info["cpu_bf16_hardware"] and info["cpu_isa_limits"] == "ONEDNN_MAX_CPU_ISA=AVX2"
    limited = {**AVX512_BF16, "cpu_isa_limits": info["cpu_isa_limits"]}
    assert answer.preface(limited) == ("This run kept oneDNN from AVX-512 (ONEDNN_MAX_CPU_ISA=AVX2): every number is "
                                       "what the frameworks did under that limit.")
    assert "This run kept" not in answer.preface(AVX512_BF16)
    # a framework's fallback line beside the flags and the limit: either could have made it fall back
    line = speed.LogLine("tf", "fp16", "oneDNN supports DT_HALF only on platforms with AVX-512.")
    logged = speed.log_sentences(pd.DataFrame({"precision": ["fp16"], "speedup_vs_fp32": [0.3]}),
                                 {**limited, "cpu_amp_flags": "avx512f"}, [line])[-1]
    assert logged.endswith("; and this run kept oneDNN from AVX-512 (ONEDNN_MAX_CPU_ISA=AVX2): the line does not say "
                           "which of the two made it fall back."), logged
    # the ceiling: a half-format matmul timed under the limit is no ceiling (0.0009 TFLOP/s measured): fp32's, named
    from amp_compare.kit import ceiling

    choice = ceiling.ceiling_choice("bf16", "off", "cpu", info)
    recorded = ceiling.ceiling_info("cpu", "fp32", choice["basis"], 2e11, 1024, choice["fp32_for"],
                                    choice["isa_limit"])
    assert ceiling.ceiling_dtype("bf16", "off", "cpu", info)[0] == "fp32"
    assert recorded["ceiling_dtype"] == "fp32 (bf16 arithmetic limited by ONEDNN_MAX_CPU_ISA=AVX2)"
    assert (recorded["ceiling_fp32_for"], recorded["ceiling_isa_limit"]) == ("bf16", "ONEDNN_MAX_CPU_ISA=AVX2")
    assert ceiling.ceiling_dtype("bf16", "off", "cpu", AVX512_BF16) == ("bf16", "")
    table = pd.DataFrame([{"framework": "torch", "precision": "bf16", "batch_size": 64, "mfu_measured": 0.04,
                           **{k: v for k, v in recorded.items() if k.startswith("ceiling_")}}])
    from amp_compare.harness.report.hardware import ceiling_marks

    assert ceiling_marks(table) == (False, True)
    assert "arithmetic limited by" in speed.hardware_paragraph(table)
    assert "arithmetic limited by" not in speed.hardware_paragraph(table.assign(ceiling_isa_limit=""))
    assert answer.preface(limited) == ("This run kept oneDNN from AVX-512 (ONEDNN_MAX_CPU_ISA=AVX2): every number "
                                       "is what the frameworks did under that limit.")
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA")
    assert "cpu_isa_limits" not in env.cpu_info("flags\t: avx2\n")

def test_a_framework_log_line_is_the_evidence_it_is(tmp_path):
    runs = _runs()
    cell = tmp_path / "cells" / "tf-fp16"
    cell.mkdir(parents=True)
    (cell / "stderr.log").write_text("I tensorflow: oneDNN supports DT_HALF only on platforms with AVX-512. Falling "
                                     "back to the default Eigen-based implementation if present.\n")
    lines = speed.framework_log_lines(tmp_path, runs)
    assert [(x.framework, x.precision) for x in lines] == [("tf", "fp16")]
    said = finding_parts(runs, pd.DataFrame(), {**AVX512_BF16, "framework_logs": lines})
    logged = next(s for s in said if s.startswith("Keras (TF)'s fp16 cells logged: \"oneDNN supports DT_HALF"))
    # the line is the framework's record of its path; beside it the CPU's flags, side by side, with no claim of
    # which AVX-512 the line meant (no record says)
    assert logged.endswith("Falling back to the default Eigen-based implementation if present\" (its own record of "
                           "the path it took); beside it, this CPU's flags list avx512f but not avx512_fp16 or "
                           "amx_fp16."), logged


def test_no_image_differing_names_the_exact_bound_not_a_bootstrap():
    from amp_compare.harness.report import phrases, verdicts
    from amp_compare.harness.report.tables import full_table

    runs, epochs, steps = _cells(seeds=(0, 1, 2))
    v = verdicts.build(full_table(runs, epochs), runs)
    acc = v[(v["metric"] == "accuracy") & (v["precision"] == "fp16")].iloc[0]
    assert (acc.status, acc.reason, acc.interval_kind) == ("same", "no_image_differed", "exact 95% bound")
    assert phrases.cell(acc).endswith("same (no image differed)") and phrases.interval_words(acc) == "95% exact bound"
    assert "bootstrap" not in phrases.cell(acc) and "p =" not in phrases.cell(acc)  # no test ran
    table = pd.DataFrame({"method": [stats.NO_DIFFERENCE]})
    assert "bootstrap" not in tables.section_paragraph(table) and "exact 95% bound" in \
        tables.section_paragraph(table)




def test_the_half_formats_entry_defines_them_and_points_at_the_runs_evidence():
    from amp_compare.harness.report.wording import RunFacts

    facts = RunFacts(frameworks=["torch"], precisions=["fp32", "fp16", "bf16"], device="cpu",
                     halves={"float16", "bfloat16"})
    text = next(e.text for e in glossary.entries(facts, {"device": "CPU"}, True) if e.id == "gl-half-formats")
    assert "Lesson: a half format can make training faster only where the hardware computes in it" in text
    # the bf16 sentence reads as English and says what it means (the audit found it garbled)
    assert ("bfloat16 has 16 bits too: float32's 8 exponent bits and only 7 mantissa bits, so about 2 decimal "
            "digits over float32's whole range. A gradient that float32 holds as a normal number does not "
            "underflow in bfloat16") in text
    # the run's evidence is the Numerics section's and the verdicts': the entry points at it, not restates it
    assert "The Gradient underflow part of the Numerics section shows what float16 did to this run's gradients." \
        in text and "This run" not in text and "against the lesson" not in text
    unmeasured = next(e.text for e in glossary.entries(facts, {"device": "CPU"}, False) if e.id == "gl-half-formats")
    assert "Gradient underflow" not in unmeasured
    assert "need loss scaling" not in text


def test_every_abbreviation_is_written_out_at_first_use_only():
    page = "<nav>MFU</nav><p>MFU is high; MFU again. p = 0.5, 3 pp</p><table><tr><th>p50</th></tr></table>"
    out, used = glossary.expand_first_use(page)
    assert out.count("model FLOP/s utilisation") == 1 and out.startswith("<nav>MFU</nav><p>MFU (model FLOP/s")
    assert used == ["MFU", "pp", "p"]  # p50 only in a table: not prose
    md, used_md = glossary.expand_first_use("| p50 step (ms) |\n`MFU` and p50 here", markdown=True)
    assert md.startswith("| p50 step (ms) |\n`MFU` and p50 (50th") and used_md == ["p50/p90/p99"]


def test_an_expansion_never_splits_a_unit_or_nests_a_parenthesis():
    # the two readings found in fresh reports: "(p (p-value: …) ≥ 0.05" and "0.0513 TFLOP (billion …)/s"
    page = "<p>No change (p ≥ 0.05 in every cell); 0.0513 TFLOP/s achieved, (3.1 ms) then 2 ms.</p>"
    out, used = glossary.expand_first_use(page)
    assert "(p (" not in out and "TFLOP (" not in out and "(3.1 ms (" not in out
    assert '(<abbr title="p-value: the probability' in out and ">p-value</abbr> ≥ 0.05" in out
    assert "0.0513 TFLOP/s (trillion floating-point operations per second) achieved" in out
    assert '(3.1 <abbr title="milliseconds">ms</abbr>) then 2 ms.' in out and used == ["p", "ms", "GFLOP"]
    md, used_md = glossary.expand_first_use("No change (p ≥ 0.05); (MFU 3%)\nTFLOP/s", markdown=True)
    assert md.startswith("No change (p-value ≥ 0.05); (MFU 3%)\nTFLOP/s (trillion floating-point operations per "
                         "second)")
    assert md.rstrip().endswith("Abbreviations: MFU: model FLOP/s utilisation: achieved FLOP/s over the ceiling's.")
    assert used_md == ["MFU", "p", "GFLOP"]


def test_the_fp8_mode_is_worded_from_each_frameworks_recipe_without_repeating_its_name():
    from amp_compare.harness.report.wording import RunFacts, summary_intro

    both = RunFacts(frameworks=["torch", "tf"], precisions=["fp32", "fp8"], device="cpu")
    intro = summary_intro(both, "1 seed", "")
    assert "fp8 (fp8" not in intro and "where offered" not in intro
    assert "PyTorch: the matmuls of Linear layers in float8, scaled by each step's own amax, one scale per tensor" \
        in intro
    assert "Keras: the matmuls of Dense and EinsumDense layers in float8, scaled by the largest amax of up to" in intro
    assert "up to 1,024 past steps" in intro and intro.count("emulated on a CPU") == 1
    # the audits show casts inside layers (Keras fp8 attention to bfloat16): no "everything else in float32"
    assert "everything else in float32" not in intro and "the rest on a float32 base, with the casts" in intro
    keras_gpu = RunFacts(frameworks=["tf"], precisions=["fp32", "fp8"], device="cuda")
    text = summary_intro(keras_gpu, "1 seed", "")
    assert "emulated" not in text and "PyTorch" not in text and "past steps" in text
