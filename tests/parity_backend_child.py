"""The parity checks of tests/test_parity.py on one Keras backend, in a process of its own.

KERAS_BACKEND is read once, when Keras is imported, so each backend needs its own process:
`KERAS_BACKEND=jax python -m tests.parity_backend_child OUT.json` imports test_parity under that
backend and calls its test functions themselves (the same weight transfer, forward, gradient,
free-running-step and loss-scaler checks, the same tolerances), then checks that --tf32 on|off is
read back from the backend into settings_used. Each check's outcome (passed, or the assertion's
message) goes to OUT.json; tests/test_keras_backends.py turns each into a test.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path

# XLA's CPU compiler made cheap for the tests' tiny models (every eager op and initializer compiles once per shape,
# each fit() its step): optimisation level 0, LLVM's expensive passes off, and the older loop emitters instead of the
# fusion emitters (their MLIR pipeline per fusion was ~40% of this child's CPU). The same ops; sums may round
# differently, far below the tolerances. JAX and TensorFlow's XLA (tests/test_device_mode.py) both know these flags.
FAST_XLA_FLAGS = ("--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true "
                  "--xla_cpu_use_fusion_emitters=false")
MODELS = os.environ.get("AMP_COMPARE_PARITY_MODELS", "simple_cnn").split(",")
# (check name, test_parity's test function, its arguments before the fixtures'): a cheap, representative set.
CHECKS = [
    *[(f"forward_inference[{m}]", "test_forward_inference_mode", (m,)) for m in MODELS],
    *[(f"forward_training[{m}]", "test_forward_training_mode", (m,)) for m in MODELS],
    *[(f"gradients[{m}]", "test_gradients_of_one_step", (m,)) for m in MODELS],
    ("loss_scaler_sequence", "test_loss_scaler_sequence", ("simple_cnn",)),
    *[(f"training_steps[{m}-{o}]", "test_training_steps_agree", (m, o)) for m in MODELS for o in ("sgd", "adam")],
]
# Float64 on JAX and torch is partly float32 in Keras 3.15: keras.src.backend.common.dtypes.result_type maps
# float64 to float32 on every backend but TensorFlow (BIT64_TO_BIT32_DTYPE), and the ops that take their dtype
# from it compute there in float32 (on torch keras.ops.matmul, i.e. every Dense layer, and the loss's mean;
# on both, BatchNormalization's statistics). Float32 and mixed runs are unaffected (their dtypes are float32 or
# half anyway). So the float64 step checks run where the whole step stays float64 (measured): simple_cnn with SGD
# and Adam on JAX, simple_cnn with SGD on torch. Left out, with what they measured: torch simple_cnn Adam
# (Adam's 1/sqrt(v) magnifies the float32 Dense rounding in tiny gradient elements: 2.4e-7 on conv2.weight after
# one step, 248x the tolerance), resnet18 on both (loss 1.7e-3 apart after 10 SGD steps on JAX, 1.8e-2 on torch).
UNSUPPORTED = {"torch": {"training_steps[simple_cnn-adam]", "training_steps[resnet18-sgd]",
                         "training_steps[resnet18-adam]"},
               "jax": {"training_steps[resnet18-sgd]", "training_steps[resnet18-adam]"}}


def prepare_process() -> None:
    """Before Keras is imported: what this child's backend needs, and no TensorFlow where it is not the backend."""
    if os.environ.get("KERAS_BACKEND") == "jax":
        # float64 steps need JAX's 64-bit mode (off by default: float64 arrays would silently be float32)
        os.environ.setdefault("JAX_ENABLE_X64", "1")
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
        # XLA compiles every eager op and initializer once per shape, ~0.5 s each here at its default
        # optimisation: FAST_XLA_FLAGS make it ~5x cheaper for these tiny models
        os.environ.setdefault("XLA_FLAGS", FAST_XLA_FLAGS)
    if os.environ.get("KERAS_BACKEND", "tensorflow") != "tensorflow":
        # Keras imports TensorFlow wherever it is installed, only to seed it (keras.utils.set_random_seed):
        # seconds of import this child never uses
        sys.modules.setdefault("tensorflow", None)
    # Keras imports its scikit-learn wrappers whenever scikit-learn is installed (scipy.stats among it, over a second
    # of every child's start): left out as the product's Keras child leaves it out (keras_impl/entry.py); the digits
    # are read from scikit-learn's file without importing it (kit/data.py digits_arrays)
    sys.modules.setdefault("sklearn", None)
    # Keras' visualization utilities import matplotlib.pyplot whenever it is installed (keras/src/visualization/
    # plot_image_gallery.py, inside `except ImportError`): ~1 CPU-second of this child's start for plots it never draws
    sys.modules.setdefault("matplotlib", None)
    if os.environ.get("KERAS_BACKEND") == "torch":
        # Keras imports JAX wherever it is installed, only to patch jax.monitoring for its Orbax callback (keras/src/
        # callbacks/orbax_checkpoint.py, inside `except ImportError`): a second of import the torch backend never uses
        sys.modules.setdefault("jax", None)


def tf32_read_back(tp) -> None:
    """--tf32 on and off, each set by the child's setup() and read back from the backend into settings_used."""
    from amp_compare.contract.config import RunConfig
    from amp_compare.keras_impl import train as kt
    from amp_compare.keras_impl.settings import settings_used
    from amp_compare.kit.data import load_digits

    data = load_digits()
    for tf32 in ("on", "off"):
        cfg = RunConfig(framework=tp.KERAS_FRAMEWORK, dataset="digits", tf32=tf32, threads=1)
        kt.setup(cfg)
        model = kt.make_model(cfg, data)
        kt.compile_model(cfg, model)  # as train() does
        used = settings_used(model, model.optimizer, model.optimizer, cfg)
        assert used["tf32"] == tf32, f"--tf32 {tf32}: the backend reads back {used['tf32']!r}"


def main(out: Path) -> int:
    prepare_process()
    import keras

    from tests import test_parity as tp

    datasets = {name: loader() for name, loader in tp.LOADERS.items() if name in {*MODELS, "simple_cnn"}}
    record: dict = {}
    results = {"backend": keras.backend.backend(), "framework": tp.KERAS_FRAMEWORK, "checks": {}, "record": record}
    skipped = UNSUPPORTED.get(keras.backend.backend(), set())
    for name, function, args in [*CHECKS, ("tf32_read_back", None, ())]:
        if name in skipped:
            continue
        start = time.perf_counter()
        try:
            with tp.keras_dtypes_restored():
                if function is None:
                    tf32_read_back(tp)
                else:  # a test_parity test, called with its fixtures' values as pytest would pass them
                    getattr(tp, function)(*args, datasets, record)
            outcome = {"passed": True, "message": ""}
        except AssertionError as exc:
            outcome = {"passed": False, "message": str(exc)[:2000]}
        except Exception:  # noqa: BLE001 - a crash is a failed check with its traceback, not a lost report
            outcome = {"passed": False, "message": traceback.format_exc()[-2000:]}
        results["checks"][name] = {**outcome, "seconds": round(time.perf_counter() - start, 2)}
    out.write_text(json.dumps(results, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
