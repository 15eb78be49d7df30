"""The PyTorch and Keras twins compute the same thing in float32 on the CPU.

Torch's weights (BatchNorm state randomised) are copied into Keras through common/weights.py;
then forward outputs (inference and training mode), one step's gradients and 10 steps of the
project's own training code (SGD with momentum and Adam) must agree, within tests/tolerances.py.
The training steps are compared after every step, each step starting from the same weights
while each optimizer keeps its own state; the free-running trajectories are compared too
(see KINK_REASON for why those of resnet18 may separate). The largest measured differences go
to parity.json under $AMP_COMPARE_ARTIFACTS (default: test-artifacts/), for the report to quote.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from common.config import RunConfig
from common.data import epoch_batches, load_digits, load_synthetic
from common.mapping import BN_EPSILON, BN_MOMENTUM_TORCH, keras_bn_momentum
from tests import tolerances
from tests.conftest import artifacts_dir

keras = pytest.importorskip("keras")
tf = pytest.importorskip("tensorflow")
torch = pytest.importorskip("torch")

SEED = 0
BATCH = 8
STEPS = 10
WIDTH = 8  # a narrow resnet18: the same graph as width 64, a fraction of the compute
LOADERS = {"simple_cnn": load_digits, "resnet18": load_synthetic}  # (16, 16, 1) and (16, 16, 3)
LR = {"sgd": 0.05, "adam": 1e-3}  # a usual SGD rate (weights move by up to ~1 in 10 steps); Adam's default
# Keras Adam adds epsilon to the uncorrected sqrt(v) (the paper's epsilon-hat), torch to the
# bias-corrected one: at step t an equal epsilon is, in torch's terms, epsilon / sqrt(1 - beta2**t)
# in Keras, 32x larger at t = 1. It changes an update by ~epsilon / (sqrt(1 - beta2**t) |g|) of
# itself: with 1e-12 that is < 1e-3 for every |g| > 3e-8, far below the WEIGHTS tolerance (the
# project's 1e-7 is tested separately: test_adam_with_the_project_epsilon_differs).
ADAM_EPSILON_NEGLIGIBLE = 1e-12


LEGEND = {
    "max_abs": "largest |keras - torch| over all compared tensors",
    "max_fraction_of_tolerance": "largest |keras - torch| / (atol + rtol * max|torch|) over tensors; <= 1 passes",
    "train_<optimizer>": "10 steps, each from torch's weights before that step; each optimizer keeps its own state",
    "train_<optimizer>_free_running": "10 steps, each framework on its own trajectory",
    "train_adam_project_epsilon": "as train_adam, with the project's Adam epsilon (1e-7) instead of 1e-12",
    "running_var_gap_unmapped": "running_var difference before applying torch's n / (n - 1) (unbiased) factor",
}


@pytest.fixture(scope="module")
def parity_record():
    """Largest measured differences, written to parity.json when the module's tests are done."""
    record: dict[str, dict[str, object]] = {}
    yield record
    tol = {k: vars(v) for k, v in vars(tolerances).items() if isinstance(v, tolerances.Tolerance)}
    summary = {"legend": LEGEND, "tolerances": tol, "width": WIDTH, "batch": BATCH, "steps": STEPS,
               "versions": {"torch": torch.__version__, "tensorflow": tf.__version__, "keras": keras.__version__},
               "results": dict(sorted(record.items()))}
    (artifacts_dir() / "parity.json").write_text(json.dumps(summary, indent=2) + "\n")


@pytest.fixture(autouse=True)
def float32_and_seeded():
    """Other tests set mixed policies; parity is a float32 property. Seeds make failures repeatable."""
    previous = keras.config.dtype_policy().name
    keras.config.set_dtype_policy("float32")
    keras.utils.set_random_seed(SEED)  # seeds Python, numpy and TensorFlow
    torch.manual_seed(SEED)
    yield
    keras.config.set_dtype_policy(previous)


@pytest.fixture(scope="module")
def datasets():
    return {name: loader() for name, loader in LOADERS.items()}


def nchw(x: np.ndarray):
    return torch.from_numpy(x).permute(0, 3, 1, 2).contiguous()


def build_pair(name: str, data, model_class=None):
    """A torch model with randomised BatchNorm state and a Keras twin holding the same weights (aligned mode)."""
    from tf_impl import models as tm
    from torch_impl import models as pm

    shape, classes = data.input_shape, data.num_classes
    torch_model = pm.build_model(name, shape, classes, width=WIDTH, bn_momentum=BN_MOMENTUM_TORCH,
                                 bn_epsilon=BN_EPSILON)
    keras_model = tm.build_model(name, shape, classes, model_class=model_class or keras.Model, width=WIDTH,
                                 bn_momentum=keras_bn_momentum(BN_MOMENTUM_TORCH), bn_epsilon=BN_EPSILON,
                                 stride2_padding="symmetric")
    weights = pm.get_weights(torch_model)
    # Fresh BatchNorm is an identity in inference mode (mean 0, var 1, gamma 1, beta 0): randomise it so
    # the inference-mode comparison checks that every statistic lands in the right place.
    rng = np.random.default_rng(SEED)
    for bn in [k.removesuffix(".running_mean") for k in weights if k.endswith(".running_mean")]:
        for entry, (low, high) in {"weight": (0.5, 1.5), "bias": (-0.2, 0.2), "running_mean": (-0.2, 0.2),
                                   "running_var": (0.5, 1.5)}.items():
            key = f"{bn}.{entry}"
            weights[key] = rng.uniform(low, high, weights[key].shape).astype(np.float32)
    pm.set_weights(torch_model, weights)
    tm.set_weights(keras_model, weights)
    return torch_model, keras_model


def first_batch(data) -> tuple[np.ndarray, np.ndarray]:
    """The first batch of the project's own shuffle: (images NHWC, labels)."""
    idx = epoch_batches(len(data.x_train), BATCH, SEED, 0, STEPS)[0]
    return data.x_train[idx], data.y_train[idx]


def max_differences(actual: dict[str, np.ndarray], expected: dict[str, np.ndarray],
                    tolerance: tolerances.Tolerance) -> dict[str, object]:
    """Largest |actual - expected| over all tensors, and the largest fraction of its tolerance used."""
    assert set(actual) == set(expected)
    worst_abs, worst_fraction, worst_name = 0.0, 0.0, ""
    for name in expected:
        diff = float(np.max(np.abs(actual[name].astype(np.float64) - expected[name]), initial=0.0))
        fraction = diff / tolerance.allowed(expected[name])
        worst_abs = max(worst_abs, diff)
        if fraction >= worst_fraction:
            worst_fraction, worst_name = fraction, name
    return {"max_abs": worst_abs, "max_fraction_of_tolerance": worst_fraction, "worst_tensor": worst_name}


def assert_within(measured: dict[str, object], what: str) -> None:
    assert measured["max_fraction_of_tolerance"] <= 1.0, f"{what}: {measured}"


def torch_running_var(keras_var: np.ndarray, initial: np.ndarray, updates: int, n: int) -> np.ndarray:
    """The running_var torch holds after `updates` BatchNorm updates that left Keras holding keras_var.

    Both update running = m * running + (1 - m) * batch_var (Keras' m = 0.9), but torch's batch_var is
    the unbiased one, n / (n - 1) times Keras' biased one, with n the values per channel (batch x H x W;
    documented for torch.nn.BatchNorm2d). The update is linear, so the factor applies to everything
    added since the start: torch = m**T * initial + n / (n - 1) * (keras - m**T * initial).
    """
    decayed = keras_bn_momentum(BN_MOMENTUM_TORCH) ** updates * initial
    return decayed + n / (n - 1) * (keras_var - decayed)


def bn_counts(keras_model) -> dict[str, int]:
    """Values per channel (n of the unbiased variance) of each BatchNorm's running_var, for one batch."""
    from common.weights import torch_module_name

    return {f"{torch_module_name(layer.name)}.running_var": BATCH * layer.output.shape[1] * layer.output.shape[2]
            for layer in keras_model.layers if isinstance(layer, keras.layers.BatchNormalization)}


def to_torch_convention(keras_weights, initial, counts, updates: int):
    """Keras' weights with each running_var mapped to the value torch's convention gives (see torch_running_var)."""
    return {k: torch_running_var(v, initial[k], updates, counts[k]) if k in counts else v
            for k, v in keras_weights.items()}


@pytest.mark.parametrize("name", sorted(LOADERS))
def test_forward_inference_mode(name, datasets, parity_record):
    x, _ = first_batch(datasets[name])
    torch_model, keras_model = build_pair(name, datasets[name])
    torch_model.eval()
    with torch.no_grad():
        expected = torch_model(nchw(x)).numpy()
    actual = keras_model(x, training=False).numpy()
    measured = max_differences({"logits": actual}, {"logits": expected}, tolerances.FORWARD)
    parity_record.setdefault(name, {})["forward_inference"] = measured
    assert_within(measured, "logits, inference mode")


@pytest.mark.parametrize("name", sorted(LOADERS))
def test_forward_training_mode(name, datasets, parity_record):
    """Batch statistics: both normalise with the biased batch variance; running stats get one update."""
    from tf_impl import models as tm
    from torch_impl import models as pm

    x, _ = first_batch(datasets[name])
    torch_model, keras_model = build_pair(name, datasets[name])
    initial = pm.get_weights(torch_model)
    torch_model.train()
    with torch.no_grad():
        expected = torch_model(nchw(x)).numpy()
    actual = keras_model(x, training=True).numpy()
    measured = max_differences({"logits": actual}, {"logits": expected}, tolerances.FORWARD)
    record = parity_record.setdefault(name, {})
    record["forward_training"] = measured
    assert_within(measured, "logits, training mode")
    counts = bn_counts(keras_model)
    stats = max_differences(to_torch_convention(tm.get_weights(keras_model), initial, counts, 1),
                            pm.get_weights(torch_model), tolerances.WEIGHTS)
    record["running_stats_after_one_update"] = stats
    assert_within(stats, "BatchNorm running statistics after one training-mode forward")


@pytest.mark.parametrize("name", sorted(LOADERS))
def test_gradients_of_one_step(name, datasets, parity_record):
    import torch.nn.functional as F

    from tf_impl import models as tm

    x, y = first_batch(datasets[name])
    torch_model, keras_model = build_pair(name, datasets[name])
    torch_model.train()
    F.cross_entropy(torch_model(nchw(x)), torch.from_numpy(y)).backward()
    expected = {k: p.grad.numpy() for k, p in torch_model.named_parameters()}
    with tf.GradientTape() as tape:
        logits = keras_model(x, training=True)
        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)(y, logits)
    grads = tape.gradient(loss, keras_model.trainable_variables)
    actual = tm.to_canonical(keras_model, grads, keras_model.trainable_variables)
    measured = max_differences(actual, expected, tolerances.GRADIENT)
    parity_record.setdefault(name, {})["gradients"] = measured
    assert_within(measured, "gradients")


def train_both(name: str, data, optimizer: str, adam_epsilon: float, follow_torch: bool) -> dict[str, object]:
    """STEPS steps of each framework's own training code from the same weights, compared after every step.

    follow_torch: Keras loads torch's weights (BatchNorm statistics included) before each of its steps, so
    every step starts from the same weights while each optimizer carries its own state (momentum, Adam's
    moments and step count) through all the steps. Without it each framework follows its own trajectory,
    which in float32 can separate for a reason that is no mismatch (see test_free_running_trajectories).
    """
    from tf_impl import models as tm
    from tf_impl.train import AmpModel, make_dataset
    from tf_impl.train import make_optimizer as keras_optimizer
    from torch_impl import models as pm
    from torch_impl.train import make_optimizer as torch_optimizer
    from torch_impl.train import make_scaler, train_step

    def config(framework: str) -> RunConfig:
        return RunConfig(framework=framework, model=name, optimizer=optimizer, lr=LR[optimizer],
                         adam_epsilon=adam_epsilon, dataset="synthetic", width=WIDTH)

    torch_model, keras_model = build_pair(name, data, model_class=AmpModel)
    plan = epoch_batches(len(data.x_train), BATCH, SEED, 0, STEPS)

    # torch: the project's train_step, batch by batch (float32: no autocast, a disabled scaler).
    cfg = config("torch")
    opt, scaler = torch_optimizer(cfg, torch_model.parameters()), make_scaler(cfg)
    torch_model.train()
    before, after, torch_losses, noise = [], [], [], {}
    for idx in plan:
        before.append(pm.get_weights(torch_model))
        loss, _ = train_step(torch_model, opt, scaler, nchw(data.x_train[idx]), torch.from_numpy(data.y_train[idx]),
                             amp_dtype=None)
        torch_losses.append(loss.numpy())
        after.append(pm.get_weights(torch_model))
        if optimizer == "adam":  # see tolerances.ADAM_NOISE_GRADIENT
            for key, p in torch_model.named_parameters():
                g = np.abs(p.grad.numpy())
                # exact zeros match anyway (no update in either framework): only noise-level non-zeros
                noise[key] = noise.get(key, False) | ((g > 0) & (g <= tolerances.ADAM_NOISE_GRADIENT.allowed(g)))

    class Stepper(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.losses: list[np.ndarray] = []
            self.weights: list[dict[str, np.ndarray]] = []

        def on_train_batch_begin(self, batch, logs=None):
            if follow_torch:
                tm.set_weights(self.model, before[batch])

        def on_train_batch_end(self, batch, logs=None):
            self.losses.append(np.asarray(logs["batch_loss"]))
            self.weights.append(tm.get_weights(self.model))

    # Keras: model.fit over the same batches, as tf_impl/train.py runs it (AmpModel.train_step).
    # (train_on_batch cannot drive AmpModel: it hands train_step (x, y, sample_weight), and
    # AmpModel.train_step unpacks exactly (x, y).)
    keras_model.compile(optimizer=keras_optimizer(config("tf")),
                        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    stepper = Stepper()
    dataset, keras_model.device_images = make_dataset(data, plan)
    keras_model.fit(dataset, epochs=1, steps_per_epoch=STEPS, shuffle=False, verbose=0, callbacks=[stepper])

    counts = bn_counts(keras_model)
    losses, weights = [], []
    for step in range(STEPS):
        start, updates = (before[step], 1) if follow_torch else (before[0], step + 1)
        losses.append(max_differences({"loss": stepper.losses[step]}, {"loss": torch_losses[step]},
                                      tolerances.LOSS) | {"step": step + 1})
        actual = to_torch_convention(stepper.weights[step], start, counts, updates)
        actual = {k: np.where(noise[k], after[step][k], v) if k in noise else v for k, v in actual.items()}
        weights.append(max_differences(actual, after[step], tolerances.WEIGHTS) | {"step": step + 1})

    def worst(measured):
        return max(measured, key=lambda m: m["max_fraction_of_tolerance"])

    over = [m["step"] for m in weights if m["max_fraction_of_tolerance"] > 1]
    return {
        "worst_loss": worst(losses),
        "worst_weights": worst(weights),
        "step10_loss_abs": losses[-1]["max_abs"],
        "step10_weights_abs": weights[-1]["max_abs"],
        "per_step_loss_abs": [m["max_abs"] for m in losses],
        "per_step_weights_abs": [m["max_abs"] for m in weights],
        "first_step_over_tolerance": over[0] if over else None,
        # How far training moved the weights: the differences above must be small against this.
        "max_weight_change": max(float(np.max(np.abs(after[-1][k] - before[0][k]))) for k in after[-1]),
        # running_var as stored, without the n / (n - 1) mapping: the gap the convention alone makes.
        # Adam only: elements left out of the weights comparison (tolerances.ADAM_NOISE_GRADIENT).
        "adam_noise_level_elements_excluded": int(sum(int(m.sum()) for m in noise.values())),
        "running_var_gap_unmapped": max((float(np.max(np.abs(stepper.weights[-1][k] - after[-1][k])))
                                         for k in counts), default=0.0),
    }


def assert_training_agrees(measured: dict[str, object], what: str) -> None:
    assert_within(measured["worst_loss"], f"{what}: loss")
    assert_within(measured["worst_weights"], f"{what}: weights")


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
@pytest.mark.parametrize("name", sorted(LOADERS))
def test_training_steps_agree_at_every_step(name, optimizer, datasets, parity_record):
    measured = train_both(name, datasets[name], optimizer, ADAM_EPSILON_NEGLIGIBLE, follow_torch=True)
    parity_record.setdefault(name, {})[f"train_{optimizer}"] = measured
    assert_training_agrees(measured, optimizer)


KINK_REASON = (
    "float32 trajectories of a deep ReLU network separate once rounding-level weight differences (~1e-6) "
    "carry a ReLU input across zero: that one unit's gradient switches on or off and the step's gradient "
    "changes by ~1e-2 (measured at width 8: a unit at -6e-7 vs +6e-6 in layer2.0, SGD step 5). torch "
    "alone shows the same jump when its gradient is taken at Keras' weights, so it is no framework "
    "mismatch; whether and when it happens depends on the machine's rounding. test_training_steps_agree"
    "_at_every_step checks every step from the same weights instead."
)


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
@pytest.mark.parametrize("name", [
    "simple_cnn",  # shallow, no BatchNorm: its free-running trajectories stay within tolerance
    pytest.param("resnet18", marks=pytest.mark.xfail(reason=KINK_REASON, strict=False)),
])
def test_free_running_trajectories(name, optimizer, datasets, parity_record):
    measured = train_both(name, datasets[name], optimizer, ADAM_EPSILON_NEGLIGIBLE, follow_torch=False)
    parity_record.setdefault(name, {})[f"train_{optimizer}_free_running"] = measured
    assert_training_agrees(measured, f"{optimizer}, free running")


@pytest.mark.xfail(strict=True, reason="Adam epsilon conventions differ: torch adds eps to the bias-corrected "
                   "sqrt(v), Keras to the uncorrected one (epsilon-hat); at the project's eps=1e-7 the first "
                   "update of weights with small gradients differs by a sizeable fraction of lr "
                   "(common/mapping.py DIFFERENCES)")
def test_adam_with_the_project_epsilon_differs(datasets, parity_record):
    measured = train_both("simple_cnn", datasets["simple_cnn"], "adam", RunConfig().adam_epsilon,
                          follow_torch=True)
    parity_record.setdefault("simple_cnn", {})["train_adam_project_epsilon"] = measured
    assert_training_agrees(measured, f"adam, epsilon {RunConfig().adam_epsilon}")
