"""Child process entry point: train one cell and write its records (see kit/child.py)."""

import sys

from amp_compare.kit.child import child_entry

sys.exit(child_entry("amp_compare.torch_impl.train"))
