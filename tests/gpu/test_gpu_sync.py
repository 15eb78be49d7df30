"""Host synchronisations of the torch training loop on a GPU, counted by CUDA itself.

The loop is the product's own: train()'s model, compile_model (fused Adam, torch.compile with CUDA graphs for
--step tuned), make_dataset and run_epoch, called as train() calls them. torch.cuda.set_sync_debug_mode turns
every synchronising CUDA call (a device-to-host copy, .item(), a stream wait) into an error or a warning. It is
switched on from the loop's own step clock (its mark at each step's end) once the warm-up steps are done
(compilation and graph capture may wait), and off again before the loop's end-of-epoch read, which is the one
wait per epoch it is allowed:
  * tuned: no synchronisation at all in the steady steps ("error": the traceback names the op that waited);
  * plain: exactly the waits the run table's host_syncs_per_step records (GradScaler.step reads found_inf on the
    host with torch's default optimizer in fp16; nothing in bf16), counted with "warn".
"""

from __future__ import annotations

import warnings

import pytest

from tests.gpu.conftest import gpu_marks

pytestmark = gpu_marks()

STEPS = 20


def _run_loop(precision: str, step: str, warmup: int, mode: str) -> tuple[int, int]:
    """run_epoch on the GPU with sync debugging in `mode` over its steps after `warmup`. Returns (synchronising calls
    counted, the run table's host_syncs_per_step for this optimizer and scaler)."""
    import io

    import torch

    from amp_compare.contract.config import RunConfig
    from amp_compare.kit.child import Progress, TrainResult
    from amp_compare.kit.data import epoch_batches, load_dataset
    from amp_compare.kit.training import StepBook
    from amp_compare.torch_impl import loop
    from amp_compare.torch_impl import train as tt

    class SyncDebugClock(loop.StepClock):
        """The loop's own clock, which marks the start and the end of every step: sync debugging goes on once
        `warmup` steps have ended and off after the last step, before the epoch's one closing read."""

        def mark(self) -> None:
            super().mark()
            if len(self.marks) == warmup + 1:
                torch.cuda.set_sync_debug_mode(mode)
            if len(self.marks) == STEPS + 1:
                torch.cuda.set_sync_debug_mode(0)

    torch._dynamo.reset()
    cfg = RunConfig(framework="torch", model="resnet18", width=16, dataset="synthetic", precision=precision,
                    device="cuda", step=step, batch_size=64, channels_last=True, augment=True, init="framework")
    data = load_dataset(cfg.dataset)
    tt.setup(cfg)
    device = torch.device("cuda")
    run = tt.compile_model(cfg, tt.make_model(cfg, data), device)
    assert run.graphs == (step == "tuned")
    x, y, _, _ = tt.make_dataset(cfg, data)
    plan = torch.from_numpy(epoch_batches(len(x), cfg.batch_size, cfg.seed, 0, STEPS)).to(device)
    assert len(plan) == STEPS
    result = TrainResult()
    book = StepBook(cfg, result, Progress(stream=io.StringIO()), lambda: {}, None)
    book.start_epoch(0, STEPS)
    run.model.train()
    try:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            loop.run_epoch(run.net, run.optimizer, run.scaler, x, y, plan, precision, SyncDebugClock(device), book,
                           graphs=run.graphs, read_every=STEPS + 1)
    finally:
        torch.cuda.set_sync_debug_mode(0)
        torch._dynamo.reset()
    assert len(result.step_loss) == STEPS and all(v == v for v in result.step_loss)  # ran every step, finite
    waits = sum("synchronizing" in str(w.message) for w in seen)
    return waits, loop.host_syncs_per_step(run.optimizer, run.scaler)


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_tuned_step_makes_no_host_synchronisation(precision):
    waits, recorded = _run_loop(precision, "tuned", warmup=6, mode="error")  # any wait raises inside the loop
    assert waits == 0 and recorded == 0


@pytest.mark.parametrize("precision, expected", [("fp16", 1), ("bf16", 0)])
def test_plain_step_waits_as_often_as_the_run_table_says(precision, expected):
    waits, recorded = _run_loop(precision, "plain", warmup=2, mode="warn")
    assert recorded == expected
    assert waits == (STEPS - 2) * recorded, (waits, recorded)
