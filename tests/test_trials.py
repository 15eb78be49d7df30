"""Speed trials (kit/trial.py): the schedule, the estimator on simulated block series, a real tiny trial per framework.

The simulations time blocks as the trial runs them: rounds of blocks in kit/trial.block_order's order, each block
k steps of its precision at the machine's speed of that moment, with noise; the machine drifts, steps, stalls.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from amp_compare.contract import records
from amp_compare.kit import trial

PRECISIONS = ("fp32", "fp16", "bf16")
SIMS = 1000
ROUNDS = 30  # 15 mirrored pairs: what a 10 s trial of ~0.3 s rounds gives


def simulate(true_ratio: float, *, drift: float = 0.0, step_change: float = 0.0, stall_share: float = 0.0,
             noise: float = 0.03, rounds: int = ROUNDS, sims: int = SIMS, seed: int = 0) -> dict[str, np.ndarray]:
    """Per-step block times (sims, rounds) per precision. fp32 steps take 10 ms, fp16 10 ms / true_ratio, bf16 25 ms;
    k per kit/trial.block_steps. The machine's slowdown at time t: 1 + drift·t/T, × (1 + step_change) in the second
    half; stall_share of blocks take 2-10× their time (one stalled block each, any precision); lognormal noise."""
    rng = np.random.default_rng(seed)
    base = {"fp32": 0.010, "fp16": 0.010 / true_ratio, "bf16": 0.025}
    ks = {p: trial.block_steps(s) for p, s in base.items()}
    per_step = {p: np.empty((sims, rounds)) for p in PRECISIONS}
    now = np.zeros(sims)
    total = rounds * sum(ks[p] * base[p] for p in PRECISIONS)
    for r in range(rounds):
        for index in trial.block_order(len(PRECISIONS), r):
            p = PRECISIONS[index]
            nominal = ks[p] * base[p]
            middle = (now + nominal / 2) / total
            slow = (1 + drift * middle) * np.where(middle > 0.5, 1 + step_change, 1.0)
            stall = np.where(rng.random(sims) < stall_share, rng.uniform(2, 10, sims), 1.0)
            wall = nominal * slow * stall * np.exp(rng.normal(0, noise, sims))
            per_step[p][:, r] = wall / ks[p]
            now = now + wall
    return per_step


@pytest.mark.parametrize("case", [
    dict(drift=0.6),  # the machine 60% slower by the end
    dict(drift=3.0),  # 4x slower by the end: a fixed order would leave a bias of ~3%
    dict(step_change=0.5),  # 50% slower from halfway
    dict(stall_share=0.05),  # 5% of blocks stalled 2-10x
    dict(),  # a known ratio on a steady machine
    dict(drift=-0.4, stall_share=0.05, noise=0.08),  # all at once, noisier
])
@pytest.mark.parametrize("true_ratio", [0.16, 1.27])
def test_interval_covers_the_true_ratio(case, true_ratio):
    times = simulate(true_ratio, **case)
    ratio, low, high = trial.ratio_interval(times["fp32"], times["fp16"])
    covered = (low <= true_ratio) & (true_ratio <= high)
    assert covered.mean() >= 0.93, (case, covered.mean())
    assert abs(np.median(np.log(ratio / true_ratio))) < 0.02  # centred on the truth


@pytest.mark.parametrize(("true_ratio", "status"), [(0.5, "slower"), (0.95, "slower"), (1.0, "same"),
                                                    (1.27, "faster"), (8.0, "faster")])
def test_status_of_known_ratios(true_ratio, status):
    times = simulate(true_ratio, drift=0.3, stall_share=0.05, sims=200, seed=1)
    ratio, low, high = trial.ratio_interval(times["fp32"], times["fp16"])
    statuses = [trial.speed_status(*v) for v in zip(ratio, low, high)]
    assert statuses.count(status) / len(statuses) >= 0.9, (true_ratio, pd.Series(statuses).value_counts().to_dict())


def stop_round(times: dict[str, np.ndarray], sim: int) -> int:
    """The rounds a trial of these blocks runs under run_blocks' rule: whole pairs, MIN_ROUNDS at least, stopping at
    the first pair boundary where kit/trial.decided holds (the budget: ROUNDS)."""
    rows = []
    for r in range(ROUNDS):
        if r % 2 == 0 and r >= trial.MIN_ROUNDS and trial.decided(rows, list(PRECISIONS)):
            return r
        rows += [{"precision": p, "wall_s": times[p][sim, r], "steps": 1} for p in PRECISIONS]
    return ROUNDS


@pytest.mark.parametrize("case", [dict(drift=0.6), dict(stall_share=0.05), dict(drift=-0.4, stall_share=0.05,
                                                                                 noise=0.08)])
@pytest.mark.parametrize("true_ratio", [0.16, 0.95, 1.27])
def test_stopping_once_decided_keeps_the_interval_honest(case, true_ratio):
    """Stopping early (kit/trial.decided) looks at the rounds repeatedly; the 95% interval at the stop still covers
    the true ratio in >= 93% of trials, and its verdict is never the wrong direction more than 2% of the time."""
    times = simulate(true_ratio, **case, sims=400, seed=3)
    stops = np.array([stop_round(times, i) for i in range(400)])
    cover, wrong = [], []
    for i, n in enumerate(stops):
        ratio, low, high = (float(v) for v in trial.ratio_interval(times["fp32"][i, :n], times["fp16"][i, :n]))
        cover.append(low <= true_ratio <= high)
        wrong.append(trial.speed_status(ratio, low, high) == ("faster" if true_ratio < 1 else "slower"))
    assert np.mean(cover) >= 0.93, (case, np.mean(cover), np.bincount(stops))
    assert np.mean(wrong) <= 0.02
    if true_ratio == 0.16:  # 6x slower: the first look decides it, the budget's other rounds are not spent
        assert np.median(stops) == trial.MIN_ROUNDS


@pytest.mark.parametrize("case", [dict(drift=0.3, stall_share=0.05), dict(), dict(stall_share=0.05)])
def test_stopping_early_near_1x_errs_no_more_than_the_whole_budget(case):
    """True ratio 1.0, where stopping early would be most tempting to get wrong: the trials stopped by decided() call
    a direction (faster or slower, both wrong) no more often than the same blocks run to the whole budget, and say
    "same" at least as often (measured: 13 vs 18 of 400, 9 vs 20, 15 vs 16)."""
    times = simulate(1.0, **case, sims=400, seed=4)
    early, whole = [], []
    for i in range(400):
        n = stop_round(times, i)
        early.append(trial.speed_status(*map(float, trial.ratio_interval(times["fp32"][i, :n], times["fp16"][i, :n]))))
        whole.append(trial.speed_status(*map(float, trial.ratio_interval(times["fp32"][i], times["fp16"][i]))))
    wrong = [sum(s in ("faster", "slower") for s in statuses) for statuses in (early, whole)]
    assert wrong[0] <= wrong[1] + 4, wrong  # 1% of 400
    assert early.count("same") >= whole.count("same") - 4


def test_speed_status_rules():
    assert trial.speed_status(1.3, 1.2, 1.4) == "faster"
    assert trial.speed_status(0.5, 0.4, 0.6) == "slower"
    assert trial.speed_status(1.0, 0.96, 1.04) == "same"
    assert trial.speed_status(1.0, 0.9, 1.1) == "undecided"
    assert trial.speed_status(1.0, float("nan"), float("nan")) == "undecided"


def test_sign_rank_matches_the_tables():
    # two-sided 95% sign-test intervals: n=6 -> 1st to 6th value (k=0), n=10 -> 2nd to 9th, n=30 -> 10th to 21st
    assert trial.sign_rank(5) == -1
    assert [trial.sign_rank(n) for n in (6, 10, 30)] == [0, 1, 9]
    _, low, high = trial.median_interval(np.arange(10.0))
    assert (low, high) == (1.0, 8.0)


def test_block_order_rotates_and_mirrors():
    orders = [trial.block_order(3, r) for r in range(6)]
    assert orders == [[0, 1, 2], [2, 1, 0], [1, 2, 0], [0, 2, 1], [2, 0, 1], [1, 0, 2]]
    assert trial.block_steps(0.017) == 3 and trial.block_steps(0.11) == 1  # a slow precision: fewer steps


def blocks_frame(times: dict[str, np.ndarray], sim: int) -> pd.DataFrame:
    rows = []
    for r in range(times["fp32"].shape[1]):
        for position, index in enumerate(trial.block_order(len(PRECISIONS), r)):
            p = PRECISIONS[index]
            k = 2
            rows.append({"run_id": "r", "trial_id": "torch-simple_cnn-digits-b64-plain", "framework": "torch",
                         "model": "simple_cnn", "dataset": "digits", "batch_size": 64, "step_loop": "plain",
                         "round": r, "position": position, "precision": p, "steps": k,
                         "wall_s": times[p][sim, r] * k, "cpu_s": times[p][sim, r] * k * (0.9 if r == 3 else 1.9),
                         "threads": 2})
    frame = pd.DataFrame(rows)
    frame["contended"] = trial.contended_flags(frame)
    return frame


def test_trial_summary_reads_the_table():
    times = simulate(1.27, drift=0.3, sims=3, rounds=21)
    frame = blocks_frame(times, 0)
    trial.check("trials", frame, strict=True)
    summary = trial.trial_summary(frame)
    assert list(summary["precision"]) == ["fp16", "bf16"]
    row = summary.iloc[0]
    ratio, low, high = trial.ratio_interval(times["fp32"][0], times["fp16"][0])
    assert (row["ratio"], row["low"], row["high"]) == pytest.approx((ratio, low, high))
    assert row["rounds"] == 21 and row["contended_blocks"] == 2 and row["contended_precisions"] == "fp16,fp32"
    assert row["fp32_step_s"] == pytest.approx(np.median(times["fp32"][0]))
    assert trial.speed_status(row["ratio"], row["low"], row["high"]) == "faster"
    # a missing block drops its round
    gap = trial.trial_summary(frame[~((frame["round"] == 4) & (frame["precision"] == "fp16"))]).iloc[0]
    assert gap["rounds"] == 20


def test_one_stalled_block_does_not_move_the_ratio():
    times = simulate(0.5, sims=200, seed=2)
    clean = trial.ratio_interval(times["fp32"], times["fp16"])[0]
    times["fp16"][:, 7] *= 10  # one block of each trial stalled 10x
    stalled = trial.ratio_interval(times["fp32"], times["fp16"])[0]
    assert np.abs(np.log(stalled / clean)).max() < 0.02


def test_real_trials_in_both_frameworks(tiny_run):
    """The real trials of the shared tiny compare (tests/conftest.py TINY_ARGS: --trial-budget-s 2), one per framework
    through what a compare calls (harness/run/trials.run_trials -> run_trial: the forked child, the twin's
    trial.steppers over the cells' own functions, kit/trial.run_blocks), tiny and short: read from its records, not
    run again (a second pair of framework parents cost more than the trials)."""
    import json

    from amp_compare.contract.records import read_trials

    _, run_dir = tiny_run
    manifest = json.loads((run_dir / "manifest.json").read_text())
    planned = manifest["trials"]["planned"]
    assert sorted(planned) == ["tf-simple_cnn-synthetic-b16-plain", "torch-simple_cnn-synthetic-b16-plain"]
    # cells at once on this machine's CPUs (its default): the trials were set up beside the last cells (trials.Ahead)
    ahead = manifest["launcher"]["parallel"] > 1
    assert [o.get("set_up") == "beside the last cells" for o in manifest["trials"]["outcomes"].values()] == [ahead] * 2
    table = read_trials(run_dir)
    assert list(table.columns) == list(trial.TRIAL_COLUMNS)
    assert sorted(table["trial_id"].unique()) == sorted(planned)
    for tid, blocks in table.groupby("trial_id"):
        spec = json.loads((run_dir / "trials" / tid / "trial.json").read_text())
        precisions = [c["precision"] for c in spec["configs"]]
        assert precisions[0] == "fp32" and sorted(precisions) == ["bf16", "fp16", "fp32"], precisions
        rounds = blocks["round"].max() + 1
        assert rounds % 2 == 0 and len(blocks) == 3 * rounds  # whole mirrored pairs, one block per precision
        assert rounds >= trial.MIN_ROUNDS  # past the budget that building the models spent: an interval exists
        for r, rnd in blocks.groupby("round"):
            order = [precisions[i] for i in trial.block_order(3, r)]
            assert rnd.sort_values("position")["precision"].tolist() == order
        assert (blocks["steps"] >= 1).all() and (blocks["wall_s"] > 0).all() and (blocks["threads"] == 1).all()
        # k makes a block last BLOCK_S at least: each precision's median block does. Single blocks may fall short
        # on a busy machine (a descheduled calibration step makes k small: 6 of 24 blocks at load 9 on 2 cores)
        assert (blocks.groupby("precision")["wall_s"].median() > trial.BLOCK_S / 3).all()
    summary = trial.trial_summary(table)
    assert len(summary) == 4 and set(summary["precision"]) == {"fp16", "bf16"} and (summary["ratio"] > 0).all()


def test_a_block_must_end_with_a_host_read():
    """run_blocks refuses a block whose last value is not read on the host (a device tensor would let its clock stop
    while the steps still run on a GPU): the real trials above pass only because every twin's block reads one."""
    lazy = trial.Stepper("fp32", lambda k: np.float32(1.0))
    with pytest.raises(TypeError, match="not a value read on the host"):
        trial.run_blocks([lazy], budget_s=0.1)


def _cfgs(**overrides):
    from amp_compare.contract.config import RunConfig

    base = dict(model="simple_cnn", dataset="synthetic", batch_size=16, device="cpu", threads=1)
    return [RunConfig(**{**base, "framework": fw, "precision": p, "seed": s, **overrides})
            for fw in ("torch", "tf") for s in (1, 0) for p in ("bf16", "fp32", "fp16")]


def test_plan_trials_takes_fp32_and_the_mixed_precisions_of_one_seed():
    from amp_compare.harness.run.trials import plan_trials

    plan = plan_trials(_cfgs())
    assert list(plan) == ["torch-simple_cnn-synthetic-b16-plain", "tf-simple_cnn-synthetic-b16-plain"]
    for group in plan.values():
        assert [c.precision for c in group] == ["fp32", "bf16", "fp16"] and {c.seed for c in group} == {0}
    assert plan_trials([c for c in _cfgs() if c.precision != "fp32"]) == {}  # nothing to compare against
    assert plan_trials([c for c in _cfgs() if c.precision == "fp32"]) == {}
    assert plan_trials(_cfgs(trial_budget_s=0.0)) == {}  # --trial-budget-s 0: no trials


def test_a_trial_leaves_out_an_fp8_emulation_and_a_recipe_its_framework_lacks():
    """Audit: Keras' trial of a run with fp8-rowwise (no Keras recipe) failed as a whole, taking Keras bf16's speed
    verdict with it; off a GPU fp8 is an emulation whose time no report states."""
    from amp_compare.contract.config import RunConfig
    from amp_compare.harness.run.trials import plan_trials

    def cfgs(device):
        return [RunConfig(model="vit", dataset="synthetic", batch_size=16, device=device, threads=1, framework=fw,
                          precision=p, seed=0)
                for fw in ("torch", "tf") for p in ("fp32", "bf16", "fp8", "fp8-rowwise")]

    on_cpu = plan_trials(cfgs("cpu"))
    assert {tid: [c.precision for c in g] for tid, g in on_cpu.items()} == {
        "torch-vit-synthetic-b16-plain": ["fp32", "bf16"], "tf-vit-synthetic-b16-plain": ["fp32", "bf16"]}
    on_gpu = plan_trials(cfgs("cuda"))
    assert {tid: [c.precision for c in g] for tid, g in on_gpu.items()} == {
        "torch-vit-synthetic-b16-plain": ["fp32", "bf16", "fp8", "fp8-rowwise"],
        "tf-vit-synthetic-b16-plain": ["fp32", "bf16", "fp8"]}


def test_run_trials_skips_finished_trials_and_records_a_failed_one(tmp_path, monkeypatch):
    from amp_compare.contract import records
    from amp_compare.harness.run import trials

    done = tmp_path / "trials" / "torch-simple_cnn-synthetic-b16-plain"
    done.mkdir(parents=True)
    records.atomic_write_table(done / "trials.parquet", pd.DataFrame({"round": [0]}))
    called = []

    def fake_run_trial(cfgs, run_dir, run_id, timeout, on_event):
        called.append(trial.trial_id(cfgs[0]))
        raise RuntimeError("no luck")

    monkeypatch.setattr(trials, "run_trial", fake_run_trial)
    manifest = {}
    assert trials.run_trials(_cfgs(), tmp_path, "r", 60, None, manifest) is None
    assert called == ["tf-simple_cnn-synthetic-b16-plain"]  # the finished one is not rerun
    outcome = manifest["trials"]["outcomes"]["tf-simple_cnn-synthetic-b16-plain"]
    assert outcome["status"] == "failed" and "no luck" in outcome["error"]
    assert manifest["trials"]["planned"] == sorted(["torch-simple_cnn-synthetic-b16-plain", called[0]])


def test_a_timed_out_trial_is_recorded_failed_without_blocks(tmp_path, monkeypatch):
    from amp_compare.harness.run import forkserver, trials

    def timed_out(cmd, cfg, out, env, timeout, on_event, placement, fork):
        (out / "trials.parquet").write_bytes(b"partial")
        return -9, f"timed out after {timeout:g} s"

    monkeypatch.setattr(trials, "_run_child", timed_out)
    monkeypatch.setattr(forkserver, "server_for", lambda *a: None)
    group = trials.plan_trials(_cfgs(trial_budget_s=1.0))["torch-simple_cnn-synthetic-b16-plain"]
    outcome = trials.run_trial(group, tmp_path, "r", 3600)
    assert outcome["status"] == "failed" and outcome["error"] == "timed out after 126 s"  # 120 + 6 x the budget
    out = tmp_path / "trials" / "torch-simple_cnn-synthetic-b16-plain"
    assert not (out / "trials.parquet").exists() and "timed out" in (out / "failed.json").read_text()


def test_contended_blocks_are_those_that_lost_their_cores():
    """The rule on the CPU seconds per second measured on the 2-core AVX2 EPYC (kit/trial.py CONTENDED_SHARE)."""
    def flags(shares, gpu=False):
        frame = pd.DataFrame({"trial_id": "t", "precision": "fp32", "wall_s": 1.0, "cpu_s": shares, "threads": 2})
        return trial.contended_flags(frame, gpu=gpu).tolist()

    assert flags([1.95, 1.97, 0.98, 1.93]) == [False, False, True, False]  # PyTorch idle, one block beside a process
    assert flags([1.25, 1.22, 1.29, 0.8]) == [False, False, False, True]  # a model that never uses both threads
    assert flags([1.0, 0.98, 1.02, 0.99]) == [True] * 4  # busy from start to end
    assert flags([1.0, 0.98, 1.02, 0.5], gpu=True) == [False, False, False, True]  # a GPU's host mostly waits


def test_run_blocks_stops_once_the_rounds_decide_and_not_before():
    """run_blocks (a fake clock: each block advances it by its steps' time) stops a trial whose mixed precisions are
    6x slower at MIN_ROUNDS, long before its budget; a precision at fp32's speed within noise keeps it running
    until its interval narrows to "same" or the budget ends."""
    rng = np.random.default_rng(5)
    now = [0.0]

    def stepper(precision: str, step_s: float, noise: float = 0.0) -> trial.Stepper:
        def run(k: int) -> float:
            now[0] += k * step_s * float(np.exp(rng.normal(0, noise)))
            return 0.0
        return trial.Stepper(precision, run)

    def rounds(*steppers) -> int:
        rows = trial.run_blocks(list(steppers), budget_s=60.0, clock=lambda: now[0], cpu_clock=lambda: now[0])
        return max(r["round"] for r in rows) + 1

    assert rounds(stepper("fp32", 0.01), stepper("fp16", 0.06), stepper("bf16", 0.06)) == trial.MIN_ROUNDS
    now[0] = 0.0
    assert rounds(stepper("fp32", 0.01, 0.03), stepper("fp16", 0.01, 0.03)) > trial.MIN_ROUNDS + 4


def test_the_speed_section_shows_the_trial_each_verdict_rests_on(tiny_run):
    """Audit: every speed verdict rested on data the report did not show. The Speed section's table has one row per
    trial x mixed precision: its ratio and interval as the answer gives them, its rounds, contended blocks and
    threads."""
    from amp_compare.harness.report import speed

    _, run_dir = tiny_run
    trials = records.read_run(run_dir)["trials"]
    table = speed.trials_table(trials)
    mixed = trials[trials["precision"] != "fp32"].groupby(["trial_id", "precision"]).ngroups
    assert len(table) == mixed > 0
    assert set(table["threads"]) == set(trials["threads"])
    assert all(int(r.split(" of ")[1]) == 2 * n for r, n in zip(table["contended blocks"], table["rounds"]))
    page = (run_dir / "index.html").read_text()
    assert 'id="speed-trials"' in page and table["speed (× fp32's)"].iloc[0] in page
    assert speed.trials_table(None).empty


def _allowed_cpus(pid: int) -> set[str]:
    """The CPUs each thread of a process may run on (/proc: affinity is per thread)."""
    from pathlib import Path

    out = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        status = (task / "status").read_text()
        out.add(next(ln.split(":")[1].strip() for ln in status.splitlines() if ln.startswith("Cpus_allowed_list")))
    return out


def test_a_trial_set_up_ahead_waits_on_its_core_and_times_its_rounds_only_once_released(tmp_path):
    """harness/run/trials.Ahead, as run_parallel drives it beside a run's last cells: a trial's child builds and warms
    up its models pinned to the one core it was given, then waits with nothing timed; release() gives every thread of
    it the harness's cores and GO, and its rounds follow. stop() (Ctrl-C) ends a trial that is still held: no process
    is left waiting."""
    import os
    import threading

    from amp_compare.contract.config import RunConfig
    from amp_compare.harness.run import trials

    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two usable CPUs to tell one core from all of them")
    cpu = min(os.sched_getaffinity(0))
    configs = [RunConfig(framework="torch", dataset="synthetic", precision=p, batch_size=b, threads=2, init="framework",
                         trial_budget_s=0.2) for b in (8, 16) for p in ("fp32", "bf16")]
    ahead = trials.Ahead(configs, tmp_path, "held", timeout=120)
    ready = {tid: threading.Event() for tid, _ in ahead.todo}
    first, second = (ahead.start_next(cpu, lambda tid: ready[tid].set()) for _ in range(2))
    for tid in (first, second):
        assert ready[tid].wait(120) and ahead.started[tid].pid, ahead.started[tid].outcome
    pid = ahead.started[first].pid
    assert _allowed_cpus(pid) == {str(cpu)}  # every thread it started (torch's 2) on the one core it was given
    assert not (tmp_path / "trials" / first / "trials.parquet").exists()  # held: no block timed yet
    events = []
    outcome = ahead.release(first, events.append)
    assert outcome["status"] == "ok" and outcome["set_up"] == "beside the last cells", outcome
    assert events[0] == {"kind": "released", "cpus": sorted(os.sched_getaffinity(0))}  # its rounds: every core
    blocks = pd.read_parquet(tmp_path / "trials" / first / "trials.parquet")
    assert blocks["round"].max() + 1 >= trial.MIN_ROUNDS and (blocks["threads"] == 2).all()
    held = ahead.started[second].pid
    ahead.stop()
    assert ahead.started[second].outcome["status"] == "failed"
    assert not os.path.exists(f"/proc/{held}") or "Z" in open(f"/proc/{held}/stat").read().rsplit(")", 1)[1][:3]


def test_the_longest_set_up_goes_first_among_trials_whose_initial_weights_exist(tmp_path):
    """Ahead.next_index: the trial whose finished cells spent the most in compile/warm-up (their phases.parquet) is set
    up first, so that it overlaps the last cells; one whose shared initial weights are not made yet waits."""
    from amp_compare.contract.config import RunConfig
    from amp_compare.harness.run import runner, trials

    configs = [RunConfig(framework=fw, model=model, dataset="digits", precision=p)
               for fw in ("torch", "tf") for model in ("simple_cnn", "vit") for p in ("fp32", "bf16")]
    ahead = trials.Ahead(configs, tmp_path, "order", timeout=60)
    warm_up = {("tf", "vit"): 7.5, ("tf", "simple_cnn"): 0.7, ("torch", "vit"): 0.1}  # torch simple_cnn: unfinished
    for cfg in configs:
        if (cfg.framework, cfg.model) in warm_up:
            (tmp_path / "cells" / cfg.cell_id).mkdir(parents=True)
            pd.DataFrame({"phase": ["training", "compile/warm-up"], "seconds": [30.0, warm_up[cfg.framework,
                                                                                              cfg.model]]}
                         ).to_parquet(tmp_path / "cells" / cfg.cell_id / "phases.parquet")
    for cfg in configs:
        if cfg.model == "simple_cnn":
            runner.shared_init_path(tmp_path, cfg).parent.mkdir(parents=True, exist_ok=True)
            runner.shared_init_path(tmp_path, cfg).touch()
    order = []
    while (index := ahead.next_index()) is not None:
        order.append(ahead.todo.pop(index)[0])
    assert order == ["tf-simple_cnn-digits-b64-plain", "torch-simple_cnn-digits-b64-plain"]  # the vit's weights: none
    for cfg in configs:
        runner.shared_init_path(tmp_path, cfg).touch()
    ahead = trials.Ahead(configs, tmp_path, "order", timeout=60)
    order = []
    while (index := ahead.next_index()) is not None:
        order.append(ahead.todo.pop(index)[0].split("-b64")[0])
    assert order == ["tf-vit-digits", "tf-simple_cnn-digits", "torch-vit-digits", "torch-simple_cnn-digits"]


def test_a_blocks_steps_come_from_the_fastest_of_a_few_steps_not_one():
    """A fast step timed alone, with one scheduler tick beside it (4x its steady time), made every block of a real
    trial last a quarter of BLOCK_S on a Xeon, and the mean of three with one slow among them a fifth (Keras bf16 in
    the tiny compare): k comes from the fastest of up to K_STEPS steps; a slow step is timed once."""
    now, calls = [0.0], []

    def stepper(precision: str, times: list[float]) -> trial.Stepper:
        def run(k: int) -> float:
            calls.append((precision, k))
            now[0] += sum(times.pop(0) if times else times_steady[precision] for _ in range(k))
            return 0.0
        return trial.Stepper(precision, run)

    times_steady = {"fp32": 0.001, "fp16": 0.3}
    rows = trial.run_blocks([stepper("fp32", [0.004]), stepper("fp16", [])], budget_s=0.0, warmup=0,
                            clock=lambda: now[0], cpu_clock=lambda: now[0])
    k = {r["precision"]: r["steps"] for r in rows}
    assert k["fp32"] == trial.block_steps(0.001) == 50  # one step alone: 13; the five's mean: 32
    assert k["fp16"] == 1 and calls[:7].count(("fp16", 1)) == 1  # timed once: 0.3 s is past a fifth of a block
