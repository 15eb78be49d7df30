"""The Glossary section and the page's abbreviations, generated from the run: entries only for what it had
(wording.RunFacts), general lessons with this run's evidence; each abbreviation written out at its first use
(`expand_first_use`)."""

from __future__ import annotations

import html
import re
from dataclasses import dataclass

import numpy as np
import pandas as pd

from amp_compare.contract import precision as precisions
from amp_compare.contract.config import display_order
from amp_compare.contract.config import framework_label as _label
from amp_compare.contract.fp8 import FP8_MAX
from amp_compare.harness.report import phrases, scaling, verdicts
from amp_compare.harness.report.numerics import ZERO_GRADIENT_PARAM, underflow_summary
from amp_compare.harness.report.speed import ARITHMETIC_FLAGS, has_arithmetic, isa_limit
from amp_compare.kit.fp16 import FP16_MAX

# abbreviation -> (how it is found in text, its expansion). "p" only where it stands for a p-value.
ABBREVIATIONS = {
    "MFU": (r"\bMFU\b", "model FLOP/s utilisation: achieved FLOP/s over the ceiling's"),
    "pp": (r"(?<=\d )pp\b|\(pp\)", "percentage points: a difference of two percentages"),
    "p": (r"\bp(?= (?:=|<|&lt;|≥))|^p$", "p-value: the probability of a difference at least this large if "
                                          "precision changed nothing"),
    "McNemar": (r"\bMcNemar\b", "McNemar's test: compares two classifiers on the same images from the images "
                                "exactly one of them got right"),
    "IQR": (r"\bIQR\b", "interquartile range: the middle half of the values, 25th to 75th percentile"),
    "p50/p90/p99": (r"\bp(?:50|90|99)\b", "50th (the median), 90th and 99th percentile of the step times"),
    "RSS": (r"\bRSS\b", "resident set size: the process's memory in RAM"),
    "ms": (r"\bms\b", "milliseconds"),
    "MiB": (r"\bMiB\b", "mebibytes: 2^20 = 1,048,576 bytes"),
    "GFLOP": (r"\b[GT]FLOP\b", "billion (G) or trillion (T) floating-point operations; /s: per second"),
    "CI": (r"\bCI\b", "confidence interval"),
    "SQNR": (r"\bSQNR\b", "signal-to-quantization-noise ratio: a tensor's power over its rounding error's, in dB"),
    "amax": (r"\bamax\b", "the largest magnitude in a tensor, which its fp8 scale is set from"),
    "fmax": (r"\bfmax\b", f"the largest finite value of an fp8 format: {FP8_MAX['float8_e4m3fn']:,.0f} for e4m3, "
                             f"{FP8_MAX['float8_e5m2']:,.0f} for e5m2"),
    "e4m3": (r"\be4m3\b", "fp8 with 4 exponent and 3 mantissa bits: more precision, less range"),
    "e5m2": (r"\be5m2\b", "fp8 with 5 exponent and 2 mantissa bits: more range, less precision"),
}
# a first use inside a parenthesis reads as a word that explains itself rather than a nested parenthesis
SHORT = {"p": "p-value"}
UNIT_WORDS = {"G": "billion", "T": "trillion"}
SKIP_TAGS = ("style", "title", "code", "pre", "nav", "script", "dt", "table")  # tables: headers and values, not prose
BLOCK_TAGS = {"p", "li", "div", "td", "th", "dd", "dt", "h1", "h2", "h3", "h4", "h5", "h6", "figcaption", "section",
              "caption", "summary", "details", "ul", "ol", "br", "table", "tr", "figure", "body", "header"}


@dataclass(frozen=True)
class Entry:
    id: str
    term: str
    text: str


def _expansion(abbr: str, token: str) -> str:
    """What `token` (the whole unit token, e.g. "TFLOP/s") stands for: one reading, not every variant's."""
    if abbr == "GFLOP":
        return f"{UNIT_WORDS[token[0]]} floating-point operations" + (" per second" if token.endswith("/s") else "")
    return ABBREVIATIONS[abbr][1]


def _depth(text: str, start: int = 0) -> int:
    """How many parentheses are open after `text` for one that had `start` open before it."""
    for ch in text:
        start = start + 1 if ch == "(" else max(start - 1, 0) if ch == ")" else start
    return start


class _Expander:
    """Writes out the first use of each abbreviation in visible text after the whole token at parenthesis depth 0;
    a first use inside a parenthesis is marked instead (HTML <abbr title>, or a self-explaining short form)."""

    def __init__(self, markdown: bool):
        self.markdown, self.found, self.nested, self.depth = markdown, {}, {}, 0

    def text(self, part: str, index: int) -> str:
        for abbr, (pattern, _) in ABBREVIATIONS.items():
            pos = 0
            while abbr not in self.found and (m := re.compile(pattern, re.M).search(part, pos)):
                part, pos = self._one(abbr, part, m, index)
        self.depth = _depth(part.rsplit("\n", 1)[-1] if self.markdown and "\n" in part else part,
                            0 if self.markdown and "\n" in part else self.depth)
        return part

    def _one(self, abbr: str, part: str, m: re.Match, index: int) -> tuple[str, int]:
        end = m.end() + len(re.match(r"(?:/[A-Za-z]+)*", part[m.end():]).group())  # the whole unit token
        token = part[m.start():end]
        line_start = part.rfind("\n", 0, m.start()) + 1 if self.markdown else 0
        before = self.depth if not (self.markdown and line_start) else 0
        expansion = _expansion(abbr, token)
        if _depth(part[line_start:m.start()], before) == 0:
            self.found[abbr] = index
            words = f" ({expansion})" if self.markdown else html.escape(f" ({expansion})", quote=False)
            return part[:end] + words + part[end:], end + len(words)
        if abbr in self.nested:
            return part, end
        self.nested[abbr] = expansion
        shown = SHORT.get(abbr, token)
        if self.markdown:
            if abbr in SHORT:
                self.found[abbr] = index
            return part[:m.start()] + shown + part[end:], m.start() + len(shown)
        self.found[abbr] = index
        marked = f'<abbr title="{html.escape(expansion)}">{shown}</abbr>'
        return part[:m.start()] + marked + part[end:], m.start() + len(marked)


def expand_first_use(page: str, markdown: bool = False) -> tuple[str, list[str]]:
    """(`page` with each abbreviation written out at its first use, the abbreviations found); HTML skips
    SKIP_TAGS, Markdown skips code spans and table rows and ends with the ones only used in parentheses."""
    expander = _Expander(markdown)
    # Markdown: code spans and table rows are left alone (a header cell is no place for a definition)
    parts = re.split(r"(`[^`]*`|^\|.*$)" if markdown else r"(<[^>]+>)", page, flags=re.M)
    skipping: list[str] = []
    for i, part in enumerate(parts):
        if markdown and part.startswith(("`", "|")) or not markdown and part.startswith("<"):
            tag = re.match(r"</?\s*([a-zA-Z0-9]+)", part) if not markdown else None
            name = tag.group(1).lower() if tag else ""
            if name in BLOCK_TAGS:
                expander.depth = 0
            if name in SKIP_TAGS:
                if part.startswith("</"):
                    skipping = [t for t in skipping if t != name]
                elif not part.endswith("/>"):
                    skipping.append(name)
            continue
        if skipping or not part.strip():
            continue
        parts[i] = expander.text(part, i)
    out = "".join(parts)
    late = {a: e for a, e in expander.nested.items() if a not in expander.found}
    if markdown and late:
        out = out.rstrip("\n") + "\n\nAbbreviations: " + "; ".join(f"{a}: {e}" for a, e in late.items()) + ".\n"
    return out, [a for a in ABBREVIATIONS if a in expander.found or a in expander.nested]


def _format_evidence(verdicts: pd.DataFrame, environment: dict, half: str) -> str:
    """This run's evidence on the lesson "a half format is fast only where the hardware computes in it": its speed
    verdicts (the trials) of the precisions computing in `half`."""
    if verdicts.empty or environment.get("cpu_model") is None or environment.get("device", "cpu") != "cpu":
        return ""
    rows = verdicts[(verdicts["metric"] == "speed") & np.isfinite(verdicts["estimate"].astype(float))
                    & verdicts["precision"].map(lambda p: p in precisions.BY_NAME and precisions.of(p).half == half)]
    if rows.empty:
        return ""
    ratios, status = rows["estimate"].to_numpy(float), set(rows["status"])
    arithmetic = has_arithmetic(environment, half)
    span = f"{ratios.min():.2f}×" if len(ratios) == 1 else f"{ratios.min():.2f}–{ratios.max():.2f}×"
    flags = (f"whose flags list {half} arithmetic" if arithmetic else
             f"whose flags list no {half} arithmetic ({' and '.join(ARITHMETIC_FLAGS[half])} absent)")
    # the lesson says the arithmetic is needed for a gain; slower rows on a CPU with it do not contradict it
    verdict = ("consistent with the lesson" if status == ({"faster"} if arithmetic else {"slower"}) else
               "no gain in some rows despite the arithmetic, which the lesson allows (which kernels ran was not "
               "recorded)" if arithmetic else "against the lesson: faster without the format's arithmetic"
               if "faster" in status else "no row measured faster, as the lesson predicts")
    return f" This run's speed trials: {half} rows at {span} fp32's speed on a CPU {flags}: {verdict}."


def _reference_flush(underflow: pd.DataFrame) -> str:
    """Per model x framework: the float32 reference's first-step share that float16 would flush without scaling,
    with the layers that hold it; shares held by parameters whose exact gradient is zero are said to be residue."""
    ref = underflow[precisions.is_reference(underflow["precision"]) & (underflow["when"] == "first step")
                    & (underflow["seed"] == underflow["seed"].min())]
    keys = [k for k in ("model",) if k in ref and ref["model"].nunique() > 1] + ["framework"]
    parts = []
    for key, g in ref.sort_values(keys, key=display_order, kind="stable").groupby(keys, sort=False):
        flushed = (g["flush_fraction_unscaled"].fillna(0) * g["nonzero"]).round().astype(int)
        total, nonzero = int(flushed.sum()), int(g["nonzero"].sum())
        names = (g["layer"].astype(str) + "." + g["param"].astype(str)).to_numpy()
        held = [(names[i], int(flushed.iloc[i])) for i in np.argsort(-flushed.to_numpy(), kind="stable")
                if flushed.iloc[i] > 0]
        residue = sum(n for name, n in held if ZERO_GRADIENT_PARAM.search(name))
        where = ", ".join(f"{name} {n:,}" for name, n in held[:3]) + (", …" if len(held) > 3 else "")
        who = " ".join([*(map(str, key[:-1])), _label(key[-1])])
        text = f"{who} {total / max(nonzero, 1):.3%} ({total:,} of {nonzero:,}{': ' + where if where else ''})"
        if residue:
            text += (f", {'all' if residue == total else f'{residue:,}'} of it in attention key biases, whose exact "
                     "gradient is zero (softmax ignores a constant shift): rounding residue, not evidence")
        parts.append(text)
    return "; ".join(parts)


def _mixed_lost(underflow: pd.DataFrame) -> str:
    """The largest share the run's own float16 backward lost without scaling, and in which cell."""
    s = underflow_summary(underflow)
    s = s[s["precision"].isin(precisions.names(half="float16"))].dropna(subset=["lost_unscaled"]) if not s.empty else s
    if s.empty:
        return ""
    top = s.loc[s["lost_unscaled"].idxmax()]
    who = " ".join([*([str(top["model"])] if "model" in s else []), _label(top["framework"]), top["precision"]])
    return (f" The run's own float16 backward without scaling lost up to {top['lost_unscaled']:.3%} of the "
            f"non-zero gradient elements of a probe ({who}, {top['when']}).")


def _harm_verdict(acc: pd.DataFrame | None) -> str:
    """fp16-noscale's accuracy against fp32, each row by the Accuracy section's paired test, and what it shows."""
    rows = acc[acc["precision"].isin(scaling.UNSCALED)] if acc is not None and not acc.empty else pd.DataFrame()
    if rows.empty:
        return (" No cell trained float16 without loss scaling, so this run does not measure what dropping it would "
                "cost (--precisions fp32,fp16,fp16-noscale does).")
    said = "; ".join(" ".join([*([str(r.model)] if rows["model"].nunique() > 1 else []), _label(r.framework),
                               r.precision]) + ": " + phrases.accuracy(r) for r in rows.itertuples())
    status = [verdicts.accuracy(r)["status"] for r in rows.itertuples()]
    verdict = ("dropping loss scaling cost accuracy in this run" if "lower" in status else
               "the run cannot judge every such cell's accuracy" if "not_comparable" in status else
               "this run shows no measurable harm from dropping loss scaling")
    return f" Trained without loss scaling, against fp32 (the Accuracy section's paired test): {said}: {verdict}."


def _underflow_evidence(underflow: pd.DataFrame | None, acc: pd.DataFrame | None = None) -> str:
    """This run's evidence on "float16 gradients underflow without loss scaling" from `underflow` and the
    Accuracy section's paired tests `acc`."""
    if underflow is None or underflow.empty or "flush_fraction_unscaled" not in underflow:
        return " This run measured no gradient against float16's range."
    flush = _reference_flush(underflow)
    return ((f" This run, float32 reference gradients of a cell's first step that float16 would flush without "
             f"scaling (share of the non-zero elements): {flush}." if flush else "")
            + _mixed_lost(underflow) + _harm_verdict(acc))


def entries(facts, dtype_facts: dict, comparison: str, verdicts: pd.DataFrame, environment: dict,
            underflow: pd.DataFrame | None, acc: pd.DataFrame | None = None) -> list[Entry]:
    """The glossary's entries for this run's modes, frameworks and device (`underflow`: the per-layer underflow
    records; `acc`: the Accuracy section's paired tests)."""
    out = []
    if facts.ran(half="float16"):
        out.append(Entry("gl-loss-scaling", "Loss scaling",
                         "Multiplying the loss by a factor S before the backward pass, so every gradient is S times "
                         "larger while it is computed in float16, then dividing the gradients by S before the "
                         "optimizer uses them. The Loss scaling part of the Numerics section says what it did here."))
    if facts.ran(loss_scaling="dynamic"):
        defaults = "".join(([" PyTorch's GradScaler starts at 2^16 by default."] if facts.torch else []) +
                           ([" Keras' LossScaleOptimizer at 2^15 by default."] if facts.keras else []))
        interval = f"{facts.growth[0]:,} in this run, " if facts.growth else ""
        out.append(Entry("gl-dynamic-scaling", "Dynamic loss scaling",
                         "Choosing S automatically: start high (--init-scale), and when any gradient overflows to "
                         "inf/NaN skip that update and halve S; after a run of clean steps "
                         f"({interval}--growth-interval) double it.{defaults}"))
    if facts.torch and facts.halves:
        out.append(Entry("gl-autocast", "Autocast op lists (PyTorch)", _autocast_text(dtype_facts)))
    if facts.keras and facts.halves:
        out.append(Entry("gl-policy", "Dtype policies (Keras)", _policy_text(facts, dtype_facts, comparison)))
    if facts.halves:
        out.append(_half_formats(facts, verdicts, environment, underflow, acc))
    if facts.device == "cuda":
        out.append(Entry("gl-tf32", "TF32", "TensorFloat-32: on NVIDIA Ampere and newer GPUs, float32 matrix "
                         "multiplies and convolutions may internally round inputs to a 10-bit mantissa on tensor "
                         "cores. It makes \"fp32\" faster and less precise; frameworks differ in whether it is on by "
                         "default."))
    return out


def abbreviations_html(used: list[str]) -> str:
    """The glossary's entries of the abbreviations the page used, as <dt>/<dd> pairs."""
    return "".join(f'<dt id="gl-abbr-{i}">{html.escape(a)}</dt><dd>{html.escape(ABBREVIATIONS[a][1][0].upper())}'
                   f"{html.escape(ABBREVIATIONS[a][1][1:])}.</dd>\n" for i, a in enumerate(used))


def _autocast_text(d: dict) -> str:
    text = (f"torch.autocast decides per operation, from op lists that differ between devices (CPU and CUDA "
            f"autocast each have their own); this run used {d['device']} autocast. Parameters stay float32 and are "
            "cast on the fly.")
    if d.get("precision"):
        lists = d.get("torch_ops_by_model") or {"": (d["torch_float32_ops"], d["torch_half_ops"],
                                                     d.get("torch_both_ops", []))}
        forced = f"; layers given to --fp32-layers left out: {', '.join(d['forced'])}" if d.get("forced") else ""
        text += (f" What ran in this run's own dtype audit ({d['precision']}, forward pass{forced}; an op off "
                 "autocast's lists runs in its inputs' dtype, so these are what ran, not the lists): ") + "; ".join(
            f"{model + ': ' if model else ''}ops in float32 only: {', '.join(f32) or 'none'}; in the half dtype "
            f"only: {', '.join(half) or 'none'}" + (f"; in both, by layer: {', '.join(both)}" if both else "")
            for model, (f32, half, both) in lists.items())
        text += (". The final Linear (fc) computed in "
                 f"{d['torch_fc'] or 'n/a'}, the loss in {d.get('torch_loss') or 'n/a'}.")
    return text


def _policy_text(facts, d: dict, comparison: str) -> str:
    policies = " or ".join(f"mixed_{h}" for h in sorted(facts.halves))
    text = (f"Keras decides per layer: under {policies} each layer computes in half precision and keeps float32 "
            "variables; a layer given dtype=\"float32\" computes in float32 (Keras' guide recommends it for the "
            "output layer, which defaults mode does; aligned mode keeps the output layer in the policy's dtype as "
            "torch does). Keras losses compute in float32.")
    if d.get("precision"):
        text += (f" In this run's audit ({d['precision']}, {comparison} mode) Keras' fc computed in "
                 f"{d['keras_fc'] or 'n/a'} and the loss in {d['keras_loss'] or 'n/a'}.")
    return text


def _half_formats(facts, verdicts: pd.DataFrame, environment: dict, underflow: pd.DataFrame | None,
                  acc: pd.DataFrame | None = None) -> Entry:
    both = {"float16", "bfloat16"} <= facts.halves
    term = "bfloat16 vs float16" if both else next(iter(facts.halves))
    text = ""
    if "float16" in facts.halves:
        text += ("float16 has 16 bits, 5 exponent and 10 mantissa bits: about 3 decimal digits over a range of only "
                 f"±{FP16_MAX:,.0f} down to 6e-8 (smallest normal 2^-14 ≈ 6.1e-5, smallest subnormal 2^-24 ≈ 6.0e-8). "
                 "Lesson: a gradient below 2^-25, half the smallest subnormal, rounds to zero in float16 (and "
                 "below 2^-14 loses precision), "
                 "which loss scaling exists to prevent." + _underflow_evidence(underflow, acc) + " ")
    if "bfloat16" in facts.halves:
        text += ("bfloat16 has 16 bits too: float32's 8 exponent bits and only 7 mantissa bits, so about 2 decimal "
                 "digits over float32's whole range. A gradient that float32 holds as a normal number does not "
                 "underflow in bfloat16, so no loss scaling is used. ")
    text += ("Lesson: a half format can make training faster only where the hardware computes in it (needed, "
             "not enough: the kernels a framework picks decide the rest).")
    halves = [half for half in ("float16", "bfloat16") if half in facts.halves]
    if isa_limit(environment)[0] and facts.device == "cpu":  # the flags are not what the frameworks could use
        return Entry("gl-half-formats", term, text + f" This run {isa_limit(environment)[0]}: its "
                     f"{' and '.join(halves)} rows are no evidence either way.")
    for half in halves:
        text += _format_evidence(verdicts, {**environment, "device": facts.device}, half)
    return Entry("gl-half-formats", term, text)
