"""Issue 24's ViT numerics lab, in both frameworks through each child's own train(): --attention naive overflows
float16 where the NaN/Inf locator says, --fp32-layers on that layer fixes it, bfloat16 stays finite;
the headroom is recorded per epoch and the report's "What happened" tells the story from the run's own tables.

Tiny on purpose: one block of one 64-wide head (ViT-B's head size: without the 1/sqrt(64) scale its logits start
near 12 on this data, past float16's exp limit ln(65504) ≈ 11.1), 2 steps of 64 images. Both frameworks start
from the same weights (--init shared: a file made by torch's initialisers, as a compare's first cell makes it).
"""

from __future__ import annotations

import io

import numpy as np
import pytest

from amp_compare.contract.config import RunConfig
from amp_compare.kit.child import Progress, SharedInit, build_tables
from amp_compare.kit.data import load_dataset

keras = pytest.importorskip("keras")
torch = pytest.importorskip("torch")
pytest.importorskip("tensorflow")

NAIVE = {"model": "vit", "dataset": "synthetic", "attention": "naive", "vit_dim": 64, "vit_heads": 1,
         "vit_depth": 1, "epochs": 1, "steps_per_epoch": 2, "batch_size": 64, "warmup_steps": 1, "threads": 1,
         "init": "shared", "seed": 0}


@pytest.fixture(scope="module")
def data():
    return load_dataset("synthetic")


@pytest.fixture(scope="module")
def init_file(tmp_path_factory, data):
    """The shared initial weights, made once by torch's initialisers (SharedInit, as a compare's first cell)."""
    from amp_compare.torch_impl import train as pt
    from amp_compare.torch_impl.models import get_weights, set_weights

    path = tmp_path_factory.mktemp("vit-init") / "init.npz"
    cfg = RunConfig(framework="torch", **NAIVE)
    pt.setup(cfg)
    SharedInit(path, "torch", cfg.seed).apply(pt.make_model(cfg, data), get_weights, set_weights)
    return path


def train(framework: str, precision: str, data, init_file, **overrides):
    """One cell's train() in this process (Keras' global policy put back afterwards); its result and config."""
    cfg = RunConfig(framework=framework, precision=precision, **{**NAIVE, **overrides})
    if framework == "torch":
        from amp_compare.torch_impl.train import train as run
    else:
        from amp_compare.keras_impl.train import train as run
    policy = keras.config.dtype_policy().name
    try:
        return run(cfg, data, Progress(io.StringIO()), SharedInit(init_file, framework, cfg.seed)), cfg
    finally:
        keras.config.set_dtype_policy(policy)


@pytest.mark.parametrize("framework", ["torch", "tf"])
def test_naive_attention_overflows_float16_and_fp32_layers_fix_it(framework, data, init_file, tmp_path):
    from amp_compare.harness.report import verdicts
    from amp_compare.harness.report.answer import experiment_items
    from amp_compare.harness.report.figures import make_headroom_figure
    from amp_compare.harness.report.numerics import naive_rows

    broken, cfg = train(framework, "fp16", data, init_file)
    # within the first epoch, in the forward: exp of a logit past ln(65504) is inf in float16, inf/inf NaN
    assert broken.nonfinite is not None, "the naive attention never overflowed float16"
    assert broken.nonfinite["step"] < cfg.steps_per_epoch, broken.nonfinite
    assert (broken.nonfinite["where"], broken.nonfinite["layer"]) == ("forward", "blocks.0.attn"), broken.nonfinite
    assert broken.nonfinite["value"] in ("inf", "nan")
    assert not np.isfinite(broken.step_loss[broken.nonfinite["step"]]) and broken.step_skipped[broken.nonfinite["step"]]
    # the headroom record saw why: the largest logit past float16's exp limit, the true value (recorded in float32)
    logits = [r["max_abs"] for r in broken.headroom if r["quantity"] == "attention_logit"]
    assert logits and np.log(65504) < max(logits) < 88, logits

    fixed, fixed_cfg = train(framework, "fp16", data, init_file, fp32_layers=(broken.nonfinite["layer"],))
    assert fixed.nonfinite is None and np.isfinite(fixed.step_loss).all() and not any(fixed.step_skipped)
    assert fixed.diverged_at_step is None

    # bfloat16 has float32's exponent range: exp of the same logits is finite (float32's own finiteness is the
    # headroom bound above: the logits stay below ln(float32's largest value) ≈ 88.7, so an fp32 run is not repeated)
    run, _ = train(framework, "bf16", data, init_file)
    assert run.nonfinite is None and np.isfinite(run.step_loss).all(), run.nonfinite

    # "What happened", from the runs' own tables (kit/child.build_tables, as a child writes them)
    import pandas as pd

    tables = [build_tables("t", c, r, data, 0.0) for c, r in ((cfg, broken), (fixed_cfg, fixed))]
    runs = pd.concat([t["run"] for t in tables], ignore_index=True)
    runs["cell_id"] = ["broken", "fixed"]
    headroom = pd.concat([t["headroom"].assign(cell_id=name) for t, name in zip(tables, ("broken", "fixed"))])
    # the answer's naive-attention lines, from the verdict rows a report of each run builds (numerics.naive_rows)
    for cell, status, reason, said in (
            ("broken", "overflowed", "forward_located",
             f"first skip or non-finite loss at step {broken.nonfinite['step']}; the locator found it in the "
             "forward of blocks.0.attn"),
            ("fixed", "finite", "fp32_layers_kept_finite", "with --fp32-layers blocks.0.attn: every loss finite")):
        one = runs[runs["cell_id"] == cell]
        key = one[["model", "dataset", "framework", "precision"]].assign(step_loop="plain", batch_size=64.0)
        rows = pd.DataFrame(naive_rows(key, one, headroom), columns=verdicts.COLUMNS)
        assert list(rows["status"]) == [status] and list(rows["reason"]) == [reason], rows
        ((header, (line,)),) = experiment_items(rows)
        assert header == verdicts.EXPERIMENTS[1][0] and said in line, line
        assert ("rerun with --fp32-layers blocks.0.attn" in line) == (cell == "broken"), line
    # the report's headroom figure, drawn from these headroom rows (as from a run's headroom.parquet)
    figure = make_headroom_figure(headroom, runs, tmp_path)
    assert figure is not None and figure.key == "headroom" and (tmp_path / "headroom.png").stat().st_size > 0
    assert "ln(65,504)" in figure.caption  # the naive attention's exp limit is drawn and named
