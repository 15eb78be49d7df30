"""The Glossary section's entries for what the run had, and each abbreviation written out at its first use."""

from __future__ import annotations

import html
import re
from collections import namedtuple

from amp_compare.contract.fp8 import FP8_MAX
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
SHORT = {"p": "p-value"}  # a first use inside a parenthesis: a word that explains itself, not a nested parenthesis
SKIP_TAGS = ("style", "title", "code", "pre", "nav", "script", "dt", "table")  # tables: headers and values, not prose
BLOCK_TAGS = {"p", "li", "div", "td", "th", "dd", "dt", "h1", "h2", "h3", "h4", "h5", "h6", "figcaption", "section",
              "caption", "summary", "details", "ul", "ol", "br", "table", "tr", "figure", "body", "header"}


Entry = namedtuple("Entry", "id term text")  # a glossary entry: its anchor, term and text


def _depth(text: str, start: int = 0) -> int:
    """How many parentheses are open after `text` for one that had `start` open before it."""
    for ch in text:
        start = start + 1 if ch == "(" else max(start - 1, 0) if ch == ")" else start
    return start


class _Expander:
    """Writes out an abbreviation's first use at parenthesis depth 0 (0 again on a new Markdown line), else marks it."""

    def __init__(self, markdown: bool):
        self.markdown, self.found, self.nested, self.depth = markdown, set(), {}, 0

    def text(self, part: str) -> str:
        for abbr, (pattern, _) in ABBREVIATIONS.items():
            pos, unit = 0, re.compile(f"(?:{pattern})(?:/[A-Za-z]+)*", re.M)  # the whole unit token: TFLOP/s
            while abbr not in self.found and (m := unit.search(part, pos)):
                part, pos = self._one(abbr, part, m)
        self.depth = _depth(part.rsplit("\n", 1)[-1]) if self.markdown and "\n" in part else _depth(part, self.depth)
        return part

    def _one(self, abbr: str, part: str, m: re.Match) -> tuple[str, int]:
        end, token = m.end(), m.group()
        line_start = part.rfind("\n", 0, m.start()) + 1 if self.markdown else 0
        expansion = ABBREVIATIONS[abbr][1] if abbr != "GFLOP" else (  # the reading of this token, e.g. "TFLOP/s"
            f"{'billion' if token[0] == 'G' else 'trillion'} floating-point operations"
            + (" per second" if token.endswith("/s") else ""))
        if _depth(part[line_start:m.start()], 0 if line_start else self.depth) == 0:
            self.found.add(abbr)
            words = f" ({expansion})" if self.markdown else html.escape(f" ({expansion})", quote=False)
            return part[:end] + words + part[end:], end + len(words)
        if abbr in self.nested:
            return part, end
        self.nested[abbr] = expansion
        shown = SHORT.get(abbr, token)
        if not self.markdown or abbr in SHORT:
            self.found.add(abbr)
        marked = shown if self.markdown else f'<abbr title="{html.escape(expansion)}">{shown}</abbr>'
        return part[:m.start()] + marked + part[end:], m.start() + len(marked)


def expand_first_use(page: str, markdown: bool = False) -> tuple[str, list[str]]:
    """(`page` with each abbreviation written out at its first use, the abbreviations found)."""
    expander = _Expander(markdown)
    parts = re.split(r"(`[^`]*`|^\|.*$)" if markdown else r"(<[^>]+>)", page, flags=re.M)
    skipping: list[str] = []
    for i, part in enumerate(parts):
        if markdown and part.startswith(("`", "|")) or not markdown and part.startswith("<"):
            name = tag.group(1).lower() if not markdown and (tag := re.match(r"</?\s*([a-zA-Z0-9]+)", part)) else ""
            if name in BLOCK_TAGS:
                expander.depth = 0
            if name in SKIP_TAGS and part.startswith("</"):
                skipping = [t for t in skipping if t != name]
            elif name in SKIP_TAGS and not part.endswith("/>"):
                skipping.append(name)
        elif not skipping and part.strip():
            parts[i] = expander.text(part)
    out = "".join(parts)
    late = {a: e for a, e in expander.nested.items() if a not in expander.found}
    if markdown and late:
        out = out.rstrip("\n") + "\n\nAbbreviations: " + "; ".join(f"{a}: {e}" for a, e in late.items()) + ".\n"
    return out, [a for a in ABBREVIATIONS if a in expander.found or a in expander.nested]


def entries(facts, dtype_facts: dict, underflow_measured: bool) -> list[Entry]:
    """The glossary's entries for what the run had (`dtype_facts`: numerics.op_dtype_facts)."""
    out = []
    if facts.ran(half="float16"):
        out.append(Entry("gl-loss-scaling", "Loss scaling", "Multiplying the loss by a factor S before the backward "
                         "pass, so every gradient is S times larger while it is computed in float16, then dividing the "
                         "gradients by S before the optimizer uses them. The Loss scaling part of the Numerics section "
                         "says what it did here."))
    if facts.ran(loss_scaling="dynamic"):
        defaults = ((" PyTorch's GradScaler starts at 2^16 by default." if facts.torch else "")
                    + (" Keras' LossScaleOptimizer at 2^15 by default." if facts.keras else ""))
        interval = f"{facts.growth[0]:,} in this run, " if facts.growth else ""
        out.append(Entry("gl-dynamic-scaling", "Dynamic loss scaling", "Choosing S automatically: start high "
                         "(--init-scale), and when any gradient overflows to inf/NaN skip that update and halve S; "
                         f"after a run of clean steps ({interval}--growth-interval) double it.{defaults}"))
    audit = " The Numerics section's dtype audit shows {} here." if dtype_facts.get("precision") else ""
    if facts.torch and facts.halves:
        out.append(Entry("gl-autocast", "Autocast op lists (PyTorch)", "torch.autocast decides per operation, from op "
                         "lists that differ between devices (CPU and CUDA autocast each have their own); this run used "
                         f"{dtype_facts['device']} autocast. Parameters stay float32 and are cast on the fly."
                         + audit.format("which ops ran in which dtype")))
    if facts.keras and facts.halves:
        out.append(Entry("gl-policy", "Dtype policies (Keras)", "Keras decides per layer: under "
                         f"{' or '.join(f'mixed_{h}' for h in sorted(facts.halves))} each layer computes in half "
                         "precision and keeps float32 variables; a layer given dtype=\"float32\" computes in float32 "
                         "(Keras' guide recommends it for the output layer, which defaults mode does; aligned mode "
                         "keeps the output layer in the policy's dtype as torch does). Keras losses compute in float32."
                         + audit.format("what each layer computed in")))
    if facts.halves:
        text = ("float16 has 16 bits, 5 exponent and 10 mantissa bits: about 3 decimal digits over a range of only "
                f"±{FP16_MAX:,.0f} down to 6e-8 (smallest normal 2^-14 ≈ 6.1e-5, smallest subnormal 2^-24 ≈ 6.0e-8). "
                "Lesson: a gradient below 2^-25, half the smallest subnormal, rounds to zero in float16 (and below "
                "2^-14 loses precision), which loss scaling exists to prevent."
                + (" The Gradient underflow part of the Numerics section shows what float16 did to this run's "
                   "gradients." if underflow_measured else "") + " " if "float16" in facts.halves else "") + (
            "bfloat16 has 16 bits too: float32's 8 exponent bits and only 7 mantissa bits, so about 2 decimal digits "
            "over float32's whole range. A gradient that float32 holds as a normal number does not underflow in "
            "bfloat16, so no loss scaling is used. " if "bfloat16" in facts.halves else "")
        out.append(Entry("gl-half-formats", " vs ".join(sorted(facts.halves)), text + "Lesson: a half format can make "
                         "training faster only where the hardware computes in it (needed, not enough: the kernels a "
                         "framework picks decide the rest)."))
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
