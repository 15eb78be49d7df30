"""Every registered model, for the tests that parametrise over them, and a test-only model that proves a model is
its spec and its two twins (contract/models.py): a small MLP, declared and built here only.

A test module that wants every model (the test-only MLP among them) reads `names()` at import and marks its tests
with `pytestmark = pytest.mark.usefixtures("test_models")` (tests/conftest.py): the MLP is registered while the
module's tests collect and run, and nowhere else (the CLI, its docs and their tests list the project's models).
"""

from __future__ import annotations

import functools

from amp_compare.contract import models

HIDDEN = 32  # the MLP's hidden width


def _names(size) -> tuple[str, ...]:
    return ("flatten", "hidden", "act", "fc")


def _flop_layers(input_shape, num_classes, size) -> list[models.Layer]:
    side, width, channels = input_shape
    return [models.Layer("hidden", side * width * channels * HIDDEN), models.Layer("fc", HIDDEN * num_classes)]


def torch_mlp(input_shape, num_classes):
    """torch's twin: flatten (C, H, W) -> Linear(HIDDEN) -> ReLU -> Linear(classes); modules named as Keras' layers."""
    from torch import nn

    height, width, channels = input_shape
    model = nn.Sequential()
    model.add_module("flatten", nn.Flatten())
    model.add_module("hidden", nn.Linear(height * width * channels, HIDDEN))
    model.add_module("act", nn.ReLU())
    model.add_module("fc", nn.Linear(HIDDEN, num_classes))
    return model


def keras_mlp(input_shape, num_classes, output_dtype="float32"):
    """Keras' twin: flatten (H, W, C; kit/weights.py reorders the kernel) -> Dense(HIDDEN) -> ReLU -> Dense."""
    import keras
    from keras import layers

    inputs = keras.Input(shape=input_shape)
    # float32: the images stay as they came, as torch's flatten of the float32 input (a mixed policy's Flatten would
    # cast them to the half dtype itself, an op torch's twin does not have); the Dense casts, as autocast's Linear
    x = layers.Flatten(dtype="float32", name="flatten")(inputs)
    x = layers.ReLU(name="act")(layers.Dense(HIDDEN, name="hidden")(x))
    return inputs, layers.Dense(num_classes, dtype=output_dtype, name="fc")(x)


MLP = models.ModelSpec(
    "mlp", blocks=("hidden", "fc"), layer_names=_names, flop_layers=_flop_layers, recipe=models.CNN_RECIPE,
    twins={"torch": f"{__name__}:torch_mlp", "keras": f"{__name__}:keras_mlp"})
TEST_ONLY = (MLP,)


def registered():
    """The test-only models registered for the duration."""
    return models.registered(*TEST_ONLY)


def names() -> tuple[str, ...]:
    """Every model: the project's and the test-only ones."""
    with registered():
        return models.names()


def spec(name: str) -> models.ModelSpec:
    with registered():
        return models.spec(name)


@functools.cache
def example_shape(name: str) -> tuple[int, int, int]:
    """(H, W, C) of the dataset the model's spec trains its example on."""
    from amp_compare.kit.data import load_dataset

    return load_dataset(spec(name).example.dataset).input_shape


def example_build(name: str) -> dict:
    """build_model's size keywords for the model's example (its spec's RunConfig options)."""
    from amp_compare.contract.config import RunConfig

    with registered():
        size = RunConfig(model=name, **spec(name).example.options).model_size
    return {"width": size["width"], **({"vit": size["vit"]} if "vit" in spec(name).hooks else {})}
