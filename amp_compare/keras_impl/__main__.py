"""Child process entry point: train one cell and write its records (see kit/child.py)."""

from amp_compare.keras_impl.entry import TRAIN_MODULE
from amp_compare.kit.child import child_entry
from amp_compare.kit.phases import exit_now

exit_now(child_entry(TRAIN_MODULE))
