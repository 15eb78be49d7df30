"""What both sides of the harness share: the run side (run/) measures with these, the report side (report/)
judges and words the measurement with them. Kept below both so that report/ never imports run/."""

# The calibration workload (run/calibrate.py times it; report/steadiness.py names it in its sentence).
SIZE = 256
UNSTEADY = 0.25  # rounds of one check, or checks between cells, differing by more than this: not steady
# The calibration check (harness/run/calibrate.py times it; harness/report/drift.py says what it timed): rounds of
# products of a SIZE x SIZE float32 matmul
ROUNDS = 7
REPS_PER_ROUND = 20

# Where a model's cells run fewer seeds than --seeds' default (when neither --seeds nor --repeats is given): the
# vit on a CPU, so the default compare stays within 4 minutes on a 2-core CPU, whose float16/bfloat16 are emulated
# (README, "The default matrix"). One seed still gets a paired accuracy test (McNemar, harness/report/stats.py).
# run/compare.py plans the cells with it; report/tables.py says why such a model ran fewer seeds.
DEFAULT_MODEL_SEEDS = {"cpu": {"vit": (0,)}}

# Where a model trains fewer epochs than --epochs' default (when --epochs is not given): on a CPU each model stops
# where its fp32 validation accuracy was within 1-3 points of its 12-epoch end on the digits (recorded runs: the
# simple_cnn at 98% by epoch 4 of its final 98.9%, the vit at 92-94% by epoch 6 of 95.5%; still rising a little),
# so the default compare answers within minutes on a 2-core CPU without float16/bfloat16 arithmetic. run/compare.py
# plans the cells with it and notes it.
DEFAULT_MODEL_EPOCHS = {"cpu": {"simple_cnn": 4, "vit": 6}}


def threads_text(counts) -> str:
    """Thread counts as both sides word them: "1 thread", "2 threads", "1/2 threads" (distinct, ascending)."""
    n = sorted({int(c) for c in counts})
    return f"{'/'.join(map(str, n))} thread{'' if n == [1] else 's'}" if n else ""
