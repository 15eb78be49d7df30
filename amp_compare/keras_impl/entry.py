"""What every Keras child imports first, whether started as `python -m amp_compare.keras_impl` or forked from the
harness's pre-imported parent (kit/zygote.py): the module that trains, and the imports to leave out."""

import sys

# Keras imports its scikit-learn wrappers (keras.wrappers) whenever scikit-learn is installed: scikit-learn and
# scipy.stats, a second or more of every Keras child's start, for wrappers a cell never uses. Marked missing here,
# in the child's own entry only, Keras defines the wrappers without it (they say scikit-learn is needed if called).
sys.modules.setdefault("sklearn", None)

TRAIN_MODULE = "amp_compare.keras_impl.train"
PRELOAD = ()  # lazily imported by every cell beyond what kit/zygote.py imports for every twin
