"""Child process entry point: train one cell and write its records (see common/child.py)."""

import sys

from common.child import child_main
from torch_impl.train import train

sys.exit(child_main(train))
