"""A mutant torch worker: a deliberately rank-local overflow decision.

Runs the next child (AMP_COMPARE_TEST_MUTANT_NEXT, default the real `python -m amp_compare.torch_impl`) with one
change, in the cells whose --allreduce is AMP_COMPARE_TEST_MUTANT_ALLREDUCE (default fp16) only: the DDP
communication hook of torch_impl/distributed.py, after the all-reduce, turns worker 1's reduced gradients into inf at
step AMP_COMPARE_TEST_MUTANT_STEP (default 1). Worker 1's GradScaler then sees an overflow that worker 0's does not:
it skips and halves its scale alone, which is what a scaler deciding on its own gradients would do. The per-worker
agreement check (harness/report/dataparallel.worker_agreement, through the report's rows) must fail on its records.
"""

import json
import os
import runpy
import sys

import torch.distributed as dist

from amp_compare.torch_impl import distributed

MUTANT_STEP = int(os.environ.get("AMP_COMPARE_TEST_MUTANT_STEP", "1"))
cfg = json.loads(open(sys.argv[sys.argv.index("--config") + 1]).read())
real_comm_hook = distributed.comm_hook


def comm_hook(allreduce: str):
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    base = real_comm_hook(allreduce) or default_hooks.allreduce_hook
    calls = [0]  # simple_cnn's gradients fit one bucket: one call per backward

    def hook(state, bucket):
        future, step = base(state, bucket), calls[0]
        calls[0] += 1
        if dist.get_rank() != 1 or step != MUTANT_STEP:
            return future

        def poison(done):
            reduced = done.value()
            reduced.fill_(float("inf"))
            return reduced

        return future.then(poison)

    return hook


if cfg.get("replicas", 1) > 1 and cfg.get("allreduce") == os.environ.get("AMP_COMPARE_TEST_MUTANT_ALLREDUCE", "fp16"):
    distributed.comm_hook = comm_hook
runpy.run_module(os.environ.get("AMP_COMPARE_TEST_MUTANT_NEXT", "amp_compare.torch_impl"), run_name="__main__")
