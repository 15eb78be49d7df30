"""What every Keras child imports first, whether started as `python -m amp_compare.keras_impl` or forked from the
harness's pre-imported parent (kit/zygote.py): the module that trains, and the imports to leave out."""

import os
import sys

# Keras imports its scikit-learn wrappers (keras.wrappers) whenever scikit-learn is installed: scikit-learn and
# scipy.stats, a second or more of every Keras child's start, for wrappers a cell never uses. Marked missing here,
# in the child's own entry only, Keras defines the wrappers without it (they say scikit-learn is needed if called).
sys.modules.setdefault("sklearn", None)
# TensorFlow's import imports JAX wherever JAX is installed (tensorflow/lite/python/util.py: `from jax import jit`,
# for converting JAX functions to TFLite, which no cell does): 0.5 s of a Keras-on-TensorFlow child's 3.6 s of
# imports (measured on the 2-core AVX-512 BF16 EPYC). Marked missing only where Keras runs on TensorFlow: the
# keras-jax twin's child needs JAX.
if os.environ.get("KERAS_BACKEND", "tensorflow") == "tensorflow":
    sys.modules.setdefault("jax", None)

TRAIN_MODULE = "amp_compare.keras_impl.train"
PRELOAD = ()  # lazily imported by every cell beyond what kit/zygote.py imports for every twin
