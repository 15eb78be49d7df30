"""A real framework child whose data overflows float16 on one worker only, at one step.

Runs the real child (torch or Keras: AMP_COMPARE_TEST_FRAMEWORK_MODULE, default amp_compare.keras_impl) after
setting one training image of step AMP_COMPARE_TEST_POISON_STEP's second half-batch (worker 1's slice with
--replicas 2) to 1e6: under a float16 policy the forward overflows there and worker 1's own gradients are
non-finite, worker 0's are not. A data-parallel engine that decides overflow over every worker skips the step on
all of them; one that decides on one worker's gradients applies it.
"""

import json
import os
import runpy
import sys

from amp_compare.kit import child, data

step = int(os.environ.get("AMP_COMPARE_TEST_POISON_STEP", "1"))
cfg = json.loads(open(sys.argv[sys.argv.index("--config") + 1]).read())
real_load = child.load_dataset


def load_dataset(name, data_dir=None):
    dataset = real_load(name, data_dir)
    plan = data.batch_plan(len(dataset.x_train), cfg["batch_size"], cfg["seed"], cfg["epochs"], cfg["steps_per_epoch"])
    batch = plan[0, step]
    dataset.x_train[batch[len(batch) // 2]] = 1e6  # in worker 1's contiguous half of the global batch
    return dataset


child.load_dataset = load_dataset
runpy.run_module(os.environ.get("AMP_COMPARE_TEST_FRAMEWORK_MODULE", "amp_compare.keras_impl"), run_name="__main__")
