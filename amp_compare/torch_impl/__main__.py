"""Child process entry point: train one cell and write its records (see kit/child.py)."""

from amp_compare.kit.child import child_entry
from amp_compare.kit.phases import exit_now
from amp_compare.torch_impl.entry import TRAIN_MODULE

exit_now(child_entry(TRAIN_MODULE))
