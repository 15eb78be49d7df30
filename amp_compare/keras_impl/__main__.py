"""Child process entry point: train one cell and write its records (see kit/child.py)."""

import sys

# Keras imports its scikit-learn wrappers (keras.wrappers) whenever scikit-learn is installed: scikit-learn and
# scipy.stats, a second or more of every Keras child's start, for wrappers a cell never uses. Marked missing here,
# in the child's own entry only, Keras defines the wrappers without it (they say scikit-learn is needed if called).
sys.modules.setdefault("sklearn", None)

from amp_compare.kit.child import child_entry  # noqa: E402
from amp_compare.kit.phases import exit_now  # noqa: E402

exit_now(child_entry("amp_compare.keras_impl.train"))
