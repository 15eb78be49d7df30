"""Child process entry point: train one cell and write its records (see common/child.py)."""

import sys

from common.child import child_entry

sys.exit(child_entry("torch_impl.train"))
