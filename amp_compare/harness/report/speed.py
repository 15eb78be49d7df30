"""The Speed section's words: how throughput and the warm-up figures are measured, what the CPU's flags do and
do not say, and why a mixed mode was slower than fp32 only as far as the run's own evidence goes.

Everything here is built from facts (the environment's flags, the table's ratios, lines the frameworks wrote to
their stderr), never from another sentence. An explanation names its evidence: the flags say what the CPU can
compute, not which kernels a framework ran; a framework's own log line says what it did; without either (or a
profile), the sentence says the run did not measure why.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from amp_compare.contract import precision as precisions
from amp_compare.contract.config import framework_label
from amp_compare.harness.report.hardware import log_line_flags

# Lines a framework writes to stderr that say which kernels it fell back to: (pattern, half format it is about).
# TensorFlow on a CPU without AVX-512 FP16: "oneDNN supports DT_HALF only on platforms with AVX-512. Falling back
# to the default Eigen-based implementation …" (seen in its fp16 cells).
FALLBACK_LINES = ((re.compile(r"oneDNN supports DT_HALF only on platforms with [^.]*\.\s*Falling back to [^.\n]*"),
                   "float16"),)
# The flags that give a half format arithmetic on x86 (contract/env.py records which are present).
ARITHMETIC_FLAGS = {"bfloat16": ("avx512_bf16", "amx_bf16"), "float16": ("avx512_fp16", "amx_fp16")}


@dataclass(frozen=True)
class LogLine:
    """One framework log line about kernels, as found in a cell's stderr.log."""

    framework: str
    precision: str
    half: str
    text: str


def framework_log_lines(run_dir: Path, runs: pd.DataFrame) -> list[LogLine]:
    """Each distinct FALLBACK_LINES match per framework and precision, from the finished cells' stderr.log."""
    out: dict[tuple, LogLine] = {}
    ok = runs[runs["status"] == "ok"] if "status" in runs else runs.iloc[0:0]
    for r in ok.itertuples():
        path = Path(run_dir) / "cells" / str(r.cell_id) / "stderr.log"
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        for pattern, half in FALLBACK_LINES:
            match = pattern.search(text)
            if match:
                key = (r.framework, r.precision, match.group(0))
                out.setdefault(key, LogLine(r.framework, r.precision, half, " ".join(match.group(0).split())))
    return list(out.values())


def _flags(environment: dict) -> set[str]:
    return set(filter(None, str(environment.get("cpu_amp_flags") or "").split(",")))


# What each variable limits, and its values that leave out every AVX-512 instruction (bf16 dot products included)
ISA_LIMITED = {"ONEDNN_MAX_CPU_ISA": "oneDNN", "DNNL_MAX_CPU_ISA": "oneDNN",
               "ATEN_CPU_CAPABILITY": "PyTorch's own kernels"}
BELOW_AVX512 = {"ONEDNN_MAX_CPU_ISA": {"SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2"},
                "DNNL_MAX_CPU_ISA": {"SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2"},
                "ATEN_CPU_CAPABILITY": {"DEFAULT", "AVX2"}}


def isa_limit(environment: dict) -> tuple[str, str]:
    """(what the run did, what follows for a half format's arithmetic the CPU lists), ("", "") without a limit:
    "kept oneDNN and PyTorch's own kernels from AVX-512 (ONEDNN_MAX_CPU_ISA=AVX2, ATEN_CPU_CAPABILITY=avx2)". The
    limit: the variables recorded as cpu_isa_limits (contract/env.py ISA_LIMIT_VARS); with one set, the CPU's flags
    say nothing of what the frameworks could use."""
    limits = str(environment.get("cpu_isa_limits") or "")
    if not limits:
        return "", ""
    pairs = [part.split("=", 1) for part in limits.split(", ")]
    libraries = " and ".join(dict.fromkeys(ISA_LIMITED.get(name, name) for name, _ in pairs))
    if all(value.upper() in BELOW_AVX512.get(name, ()) for name, value in pairs):
        return (f"kept {libraries} from AVX-512 ({limits})",
                f"so {libraries} could not use those instructions, whatever the flags list")
    return (f"kept {libraries} from some of the CPU's instructions ({limits})",
            "so whether the frameworks could use it is not known here")


def has_arithmetic(environment: dict, half: str) -> bool:
    key = {"bfloat16": "cpu_bf16_hardware", "float16": "cpu_fp16_hardware"}[half]
    return bool(environment.get(key))


def flags_sentence(environment: dict) -> str:
    """What the CPU's flags say about each half format's arithmetic, and what flags cannot say."""
    flags = _flags(environment)
    parts = []
    for half, names in ARITHMETIC_FLAGS.items():
        present = [f for f in names if f in flags]
        parts.append(f"{half} arithmetic {'listed (' + ', '.join(present) + ')' if present else 'not listed'}"
                     + ("" if present else f" ({' and '.join(names)} absent)"))
    f16c = "; F16C, present, only converts between float16 and float32" if "f16c" in flags else ""
    did = isa_limit(environment)[0]
    limits = f" This run {did}: the flags are not what those libraries could use." if did else ""
    return (f"This CPU's flags: {'; '.join(parts)}{f16c}. Flags say what the CPU can compute, not which kernels a "
            f"framework ran.{limits}")


def _range(values) -> str:
    lo, hi = float(np.min(values)), float(np.max(values))
    return f"{lo:.2f}×" if f"{lo:.2f}" == f"{hi:.2f}" else f"{lo:.2f}–{hi:.2f}×"


def marked(rows: pd.DataFrame) -> pd.Series:
    """Per summary row, whether its speed ratio carries ⚠ (the run does not support it)."""
    return rows.get("speed_note", pd.Series("", index=rows.index)).fillna("").astype(str) != ""


def slower_rows(rows: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(rows the run shows slower than fp32: no ⚠ and an interval below 1×, rows below 1× that carry ⚠): a ratio
    under ⚠ counts for neither side, so two runs of one matrix do not flip a count on a ratio neither supports."""
    below = rows[rows["speedup_vs_fp32"] < 1]
    high = below.get("speed_high", pd.Series(np.nan, index=below.index)).astype(float)
    flagged = marked(below)
    return below[~flagged & ~(high >= 1)], below[flagged]


def _slower_text(fmt: str, rows: pd.DataFrame, shown: pd.DataFrame, flagged: pd.DataFrame) -> str:
    modes = "/".join(dict.fromkeys([*shown["precision"], *flagged["precision"]]))
    values = ", ".join(f"{v:.2f}×" for v in flagged["speedup_vs_fp32"])
    if shown.empty:
        return (f"{modes} ({fmt}) read below fp32's speed in {len(flagged)} of {len(rows)} {fmt} rows of the "
                f"summary ({values}), each marked ⚠: this run shows no {fmt} row slower.")
    more = (f"; {len(flagged)} more read below 1× but carry ⚠ ({values}) and are not counted" if len(flagged) else "")
    return (f"{modes} ({fmt}) was slower than fp32 in {len(shown)} of {len(rows)} {fmt} rows of the summary "
            f"({_range(shown['speedup_vs_fp32'])}; rows with ⚠ not counted){more}.")


def slowdown_sentences(table: pd.DataFrame, environment: dict, logs: list[LogLine]) -> list[str]:
    """Per half format with a mixed row below fp32's speed: how many the run shows slower (slower_rows) and how
    many more carry ⚠, and what this run's evidence says about why (the flags, the frameworks' own log lines),
    scoped to this run; nothing for a format that was never below 1×."""
    mixed = table[precisions.is_mixed(table["precision"])]
    if mixed.empty:
        return []
    half = mixed["precision"].map(lambda p: precisions.of(p).half)
    out = []
    for fmt in ("float16", "bfloat16"):
        rows = mixed[half == fmt]
        shown, flagged = slower_rows(rows)
        if shown.empty and flagged.empty:
            continue
        text = _slower_text(fmt, rows, shown, flagged)
        did, follows = isa_limit(environment)
        if has_arithmetic(environment, fmt) and did:
            text += (f" This CPU's flags list {fmt} arithmetic, but this run {did}, {follows}; the run did not record "
                     "which kernels ran (a profile would).")
        elif has_arithmetic(environment, fmt):
            text += (f" This CPU's flags list {fmt} arithmetic, so they do not explain a slowdown: the run did not "
                     "record which kernels ran (a profile would).")
        else:
            text += (f" This CPU's flags list no {fmt} arithmetic ({' and '.join(ARITHMETIC_FLAGS[fmt])} absent), "
                     f"so {fmt} work cannot have run on {fmt} units here; which kernels ran instead was not "
                     "recorded" + (", except where a framework said so below." if _said(logs, fmt) else "."))
        out.append(text)
    for line in logs:  # the framework's record of its path, quoted; the CPU's flags beside it, not a reading of it
        flags = log_line_flags(line.text, environment.get("cpu_amp_flags", ""))
        did = isa_limit(environment)[0]
        limit = f"; and this run {did}: the line does not say which of the two made it fall back" if did else ""
        out.append(f"{framework_label(line.framework)}'s {line.precision} cells logged: \"{line.text}\" (its own "
                   "record of the path it took)" + (f"; {flags}{limit}." if flags else f"{limit}."))
    return out


def _said(logs: list[LogLine], fmt: str) -> bool:
    return any(line.half == fmt for line in logs)


def timing_paragraph(warmup: int) -> str:
    """The Speed section's first paragraph: the three throughput figures and how the table relates them."""
    return (f"The headline throughput is what a user's epoch takes: the images of the timed steps divided by their "
            f"wall time, with the first {warmup} steps excluded as warm-up, stalls and host syncs included; training "
            "is timed apart from validation, process start and imports. The median-step figure (batch size over the "
            "p50, the median, step time) is shown beside it: a gap of more than 10% between them is called out in "
            "the hardware table's timing note (stalled steps, syncs, or a noisy machine). Throughput from epoch "
            "time divides all images by the whole training time, the warm-up steps included; the column beside it "
            "says, per row, whether it came out lower or higher than the median-step figure and by how much. "
            "\"First step's extra time\" is the first step's time beyond the median step (ms).")


def hardware_paragraph(emulated: bool, limited: bool = False) -> str:
    """The Hardware efficiency table's paragraph (`emulated`: some cell is measured against the fp32 ceiling for
    want of its format's arithmetic; `limited`: because the run kept the frameworks from its instructions)."""
    text = ("Per cell: the median-step throughput beside the headline's wall-time one, training FLOPs per image "
            "(counted once from the layer shapes both frameworks share), the FLOP/s achieved over the timed steps' "
            "wall time, and MFU: that rate over the run's one FLOP/s ceiling per device and dtype, the best matmul "
            "of one fixed size timed by any cell of the run, in either framework (the Summary names it and each "
            "framework's own best), so both frameworks are measured against the same ceiling; where the device is "
            "in the data-sheet table, MFU against that ceiling too. The verdict host-bound / compute-bound comes "
            "from how throughput moved with the batch size; without --batch-sizes it is \"undetermined\", or "
            "\"compute-bound\" with its rule beside it (MFU ≥ 50%). \"Warm-up steps' extra time\" is what the "
            "warm-up steps took beyond as many median steps (ms), whatever it went to (first-call setup, tracing "
            "or compilation where the loop compiles); a timing note marks a wall-time figure more than 10% from "
            "the median-step one.")
    if emulated:
        text += (" Where the CPU's flags list no arithmetic for a half format, that format's cells are measured "
                 "against the fp32 matmul's ceiling (marked \"no … arithmetic\"), used because "
                 "this CPU has no arithmetic in that format: a matmul in that format would time its conversions to "
                 "float32, not a ceiling, so none is timed. The "
                 "mark says which ceiling was used, not which kernels the cells ran.")
    if limited:
        text += (" Where the run kept oneDNN or PyTorch's own kernels from a half format's instructions (marked "
                 "\"… arithmetic limited by\" and the variables that did it), that format's cells are measured "
                 "against the fp32 matmul's ceiling: a matmul in that format timed under the limit is no ceiling.")
    return text + (" An MFU over 100% is marked ⚠: the measured matmul was then not the ceiling of the kernels "
                   "the cell ran.")


def speed_intro(facts, method: str) -> str:
    """The paragraph above the speed-ratio table, for the seeds and order this run had (wording.RunFacts)."""
    seeds, how = len(facts.seeds), f" ({method})" if method else ""
    text = (f"Speed ratios with their 95% interval{how}. Each ratio is the geometric mean over "
            f"{'the seeds' if seeds > 1 else 'the one seed'} of mixed's wall-time throughput over the fp32 cell "
            "of the same seed. ⚠ marks a ratio the run cannot support: a cell of it that ran next to a stall of the "
            "machine (a calibration check far above the run's median: re-run that cell), an interval that includes "
            "1×, no interval, one seed only (its interval covers the step-to-step noise of one pair of cells, not "
            "how the ratio varies from seed to seed), fewer than 20 timed steps per cell (one seed), or a seed whose "
            "ratio the machine's own drift, seen in the checks next to its two cells, could have produced.")
    if facts.rotated:
        text += (" Cells of one model and dataset ran seed after seed with the precision order rotated per seed, "
                 "so a steady drift of the machine does not favour one precision.")
    return text


def relation(value: float, reference: float) -> str:
    """How `value` compares with `reference`, in words a reader cannot misread ("21% lower")."""
    if not (np.isfinite(value) and np.isfinite(reference)) or reference <= 0:
        return "n/a"
    change = value / reference - 1
    if abs(change) < 0.005:
        return "equal (within 0.5%)"
    return f"{abs(change):.0%} {'higher' if change > 0 else 'lower'}"


def milliseconds(seconds: float) -> str:
    """A duration in ms, with as many digits as a few-ms value needs (never "0.00 s")."""
    if seconds is None or not np.isfinite(seconds):
        return "n/a"
    ms = seconds * 1e3
    return f"{ms:,.0f}" if ms >= 100 else f"{ms:.1f}" if ms >= 1 else f"{ms:.2f}"
