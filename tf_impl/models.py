"""Keras 3 models, written the idiomatic Keras way (NHWC, functional API).

Each model has a twin of the same name in torch_impl/models.py with the same layers, shapes
and parameter counts; tests/test_models.py checks the counts layer by layer.
"""

from __future__ import annotations

import keras
from keras import layers


def simple_cnn(input_shape: tuple[int, int, int], num_classes: int) -> tuple[keras.KerasTensor, keras.KerasTensor]:
    """The tutorial network: conv3x3(32)-ReLU-maxpool2 -> conv3x3(64)-ReLU-maxpool2 -> flatten -> dense."""
    inputs = keras.Input(shape=input_shape)
    x = layers.Conv2D(32, 3, padding="same", activation="relu", name="conv1")(inputs)
    x = layers.MaxPooling2D(2)(x)
    x = layers.Conv2D(64, 3, padding="same", activation="relu", name="conv2")(x)
    x = layers.MaxPooling2D(2)(x)
    x = layers.Flatten()(x)  # flattens (H, W, C): NHWC order
    # float32 override: under a mixed policy the logits (and so the loss) are computed in
    # float32, as torch autocast computes cross-entropy in float32.
    outputs = layers.Dense(num_classes, dtype="float32", name="fc")(x)
    return inputs, outputs


def build_model(name: str, input_shape: tuple[int, int, int], num_classes: int,
                model_class: type[keras.Model] = keras.Model) -> keras.Model:
    """input_shape is (H, W, C). model_class lets train.py add its train_step to the same graph."""
    if name == "simple_cnn":
        inputs, outputs = simple_cnn(input_shape, num_classes)
        return model_class(inputs=inputs, outputs=outputs, name=name)
    raise ValueError(f"unknown model {name!r}")
