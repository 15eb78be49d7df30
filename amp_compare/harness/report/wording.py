"""The report's explanatory sentences, built from what the run contains (`RunFacts`): what did not run is not said."""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from amp_compare.contract import precision as precisions
from amp_compare.contract.config import framework_label, is_keras, ordered
from amp_compare.contract.fp8 import RECIPES
from amp_compare.harness.report import phrases
from amp_compare.harness.report.numerics import growth_facts
from amp_compare.harness.report.stats import finished


@dataclass
class RunFacts:
    frameworks: list[str]
    precisions: list[str]
    device: str
    loss_scale: float | None = None  # fp16-static's fixed scale
    growth: tuple[int, int] | None = None  # (growth interval, steps each dynamic cell ran)
    skipped: int | None = None  # steps skipped in all loss-scaled cells; None: no loss-scaled cell
    halves: set = field(default_factory=set)  # the half formats that ran: float16, bfloat16

    def ran(self, **where) -> list[str]:
        """The modes of this run with the given attributes (precision.names' keywords)."""
        return [p for p in precisions.names(**where) if p in self.precisions]

    torch = property(lambda self: "torch" in self.frameworks)
    keras = property(lambda self: any(map(is_keras, self.frameworks)))


def run_facts(manifest: dict, runs: pd.DataFrame, steps: pd.DataFrame) -> RunFacts:
    """What the run contains: its finished cells (any cell, where none finished) and the manifest's order."""
    done = finished(runs)
    source = done if not done.empty else runs
    matrix = manifest.get("matrix", {})
    frameworks = ordered(source["framework"] if "framework" in source else matrix.get("frameworks", []))
    modes = [p for p in precisions.NAMES if p in set(source.get("precision", matrix.get("precisions", [])))]
    scaled = steps[steps["precision"].isin(precisions.scaled_names())] if "precision" in steps else steps.iloc[0:0]
    static = done.get("cfg_loss_scale", pd.Series(dtype=float)).dropna() if not done.empty else pd.Series()
    return RunFacts(frameworks=frameworks, precisions=modes, device=manifest.get("device", "cpu"),
                    loss_scale=float(static.iloc[0]) if not static.empty else None,
                    growth=growth_facts(done, steps) if not done.empty and "cell_id" in steps else None,
                    skipped=int(scaled["skipped"].sum()) if not scaled.empty else None,
                    halves={precisions.of(p).half for p in modes} - {None})


def _both(frameworks, torch: str, keras: str, sep: str = " and ") -> str:
    """The torch and the Keras words, of the frameworks that ran, joined by `sep`."""
    return sep.join([torch] * ("torch" in frameworks) + [keras] * any(map(is_keras, frameworks)))


def mode_text(facts: RunFacts, name: str) -> str:
    """One precision mode as the summary's intro describes it, for this run's frameworks and settings."""
    p = precisions.of(name)
    if p.fp8:
        parts, base = [], "float32"
        for key, label in [("torch", "PyTorch")] * facts.torch + [("keras", "Keras")] * facts.keras:
            if recipe := RECIPES.get((key, name)):
                layers = " and ".join(c.strip().rsplit(".", 1)[-1] for c in recipe.converts.split(","))
                parts.append(f"{label}: the matmuls of {layers} layers in float8, " + phrases.recipe(
                    recipe.scaling, recipe.granularity, recipe.amax_history, recipe.power_of_2_scales))
                base = recipe.base
        # "a float32 base": the audits show casts to other dtypes inside layers (Keras fp8 attention: bfloat16)
        return (("; ".join(parts) or "float8 matmuls") + f"; the rest on a {base} base, with the casts the dtype "
                "audit lists" + (", emulated on a CPU" if facts.device == "cpu" else ""))
    if p.half is None:
        return "everything in float32" + ("; see TF32 in the glossary" if facts.device == "cuda" else "")
    scale = f" {facts.loss_scale:g}" if facts.loss_scale else ""
    how = _both(facts.frameworks, "autocast in PyTorch", "a dtype policy in Keras")
    return f"{how}, computing most layers in {p.half}" + {
        "dynamic": ", with dynamic loss scaling",
        "static": f", with the fixed loss scale{scale} (--loss-scale), never grown or backed off"}.get(
        p.loss_scaling, ", with no loss scaling at all (gradients below float16's range flush to zero)"
        if p.half == "float16" else " (float32's exponent range, so no loss scaling)")


def summary_intro(facts: RunFacts, seeds_text: str, loop_text: str) -> str:
    """The Summary section's first paragraph."""
    who = "Each framework" if len(facts.frameworks) > 1 else (framework_label(facts.frameworks[0])
                                                              if facts.frameworks else "The run")
    n = len(facts.precisions)
    modes = "; ".join(f"{p} ({mode_text(facts, p)})" for p in facts.precisions)
    table = (" This table is what the training cells took, one row per framework and precision; the speed verdicts "
             "above come from the speed trials." if facts.ran(half="float16") or facts.ran(half="bfloat16") else "")
    return (f"{who} trained the same network on the same data in {n} precision mode{'s' if n != 1 else ''}: {modes}."
            f"{table} Numbers are medians over {seeds_text}{f'; {loop_text}' if loop_text else ''}.")


def loss_scaling_intro(facts: RunFacts) -> list[str]:
    """The Loss scaling section's explanation: only the modes this run had, and what happened to them."""
    out = []
    if facts.ran(loss_scaling="dynamic"):
        apis = _both(facts.frameworks, "torch.amp.GradScaler", "Keras' LossScaleOptimizer")
        text = (f"{', '.join(facts.ran(loss_scaling='dynamic'))} uses dynamic loss scaling ({apis}; the glossary "
                "says how it works)")
        if facts.growth:
            interval, n = facts.growth
            text += f": after {interval:,} clean steps in a row the scale doubles. " + (
                f"No dynamically scaled cell had more than {n:,} clean steps in a row, so in this run the scale "
                "could not grow, only back off" if n <= interval else
                f"A dynamically scaled cell had {n:,} clean steps in a row, so in this run the scale could grow")
        out.append(text + ".")
    for name in facts.ran(loss_scaling="static"):
        how = _both(facts.frameworks, "PyTorch: GradScaler held at it", "Keras: the optimizer's loss_scale_factor",
                    "; ")
        scale = f" ({facts.loss_scale:g})" if facts.loss_scale else ""
        overflow = phrases.KERAS_STATIC if facts.torch else "Keras applies the update anyway"
        out.append(f"{name} multiplies the loss by a fixed scale{scale} ({how})."
                   + (f" By design, where its gradients overflow, {overflow} (Keras' BaseOptimizer.apply divides "
                      "the gradients by loss_scale_factor and applies them with no finiteness check)." if facts.keras
                      else ""))
    for name in facts.ran(half="float16", loss_scaling=None):
        out.append(f"{name} does not scale at all: what float16 cannot hold is lost.")
    if facts.ran(half="bfloat16"):
        out.append(f"{', '.join(facts.ran(half='bfloat16'))} has float32's exponent range and needs no scaling.")
    if facts.skipped is not None:
        out.append("No step was skipped in this run." if facts.skipped == 0 else
                   f"{facts.skipped:,} steps were skipped in all (each loss-scaled cell's count is below).")
    return out or ["No float16 mode ran, so nothing was loss-scaled."]


def numerics_intro(facts: RunFacts) -> str:
    """The Numerics section's first sentence: the dtype audit, and the gradient probe where float16 ran."""
    probe = (", and how the float32 gradients of every layer compare with float16's range at the first and the last "
             "step" if "float16" in facts.halves else "")
    return ("Measured outside the timed loop on each cell's first batch: which dtype every layer computes in during "
            f"one training step (the dtype audit){probe}. Each part says what happened there, from the records.")


def data_parallel_workers(frameworks, device: str, cpu_model: str) -> str | None:
    """The Data parallel section's first sentence on a CPU: what its N workers were (None on a GPU)."""
    if device != "cpu" or not frameworks:
        return None
    what = _both(frameworks, "processes (torch: torchrun's workers)", "logical devices of one process (Keras: "
                 "MirroredStrategy's CPU devices, JAX's host devices)")
    return (f"On this CPU ({cpu_model or 'CPU'}) the N workers are {what} sharing the same cores and memory: the "
            "speed figures measure that sharing and the engines' overhead, not a network or more hardware.")


def data_parallel_threads(frameworks, threads_1: int, per_worker: int | None, machine: str,
                          floor_threads: list[int] | None = None) -> str:
    """The threads of the 1-worker, floor and N-worker cells; the machine's unsteadiness where seen."""
    parts = [f"Threads: each 1-worker cell was given --threads {threads_1}",
             f"its floor cell --threads {', '.join(map(str, sorted(set(floor_threads))))}" if floor_threads else "",
             f"each torch worker of an N-worker cell used {per_worker} (the cell's --threads shared among its workers, "
             "so N workers use the cores one worker would)" if "torch" in frameworks and per_worker is not None else "",
             "Keras' replicas share their one process's threads" if any(map(is_keras, frameworks)) else "",
             "JAX takes no thread count from a running process (XLA's own pool, as its records say), so --threads "
             "does not reach its cells" if "keras-jax" in frameworks else ""]
    return "; ".join(filter(None, parts)) + "." + (
        f" The machine was unsteady over the run ({machine}): N vs 1 compares cells that ran at different times, so "
        "it carries that as well as data parallelism." if machine else "")


def reproduce_note(environment) -> str:
    """Where the run's git_sha ends in -dirty: that Reproduce needs a tree with the same changes; else ""."""
    dirty = sorted({str(v)[:-len("-dirty")] for k, v in environment.items()
                    if (k == "git_sha" or str(k).endswith(": git_sha")) and str(v).endswith("-dirty")})
    return (f"The code that ran was commit {', '.join(dirty)} with uncommitted changes (its git_sha ends in "
            "-dirty): the command alone does not rebuild this run; it needs a tree with those same changes, "
            "which the records do not hold.") if dirty else ""
