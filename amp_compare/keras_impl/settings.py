"""What a Keras cell trained with: Keras' own defaults, and the settings read back from the live objects.

Read beside torch_impl/settings.py; harness/report/settings_check.py compares the two children's records
per cell (contract/mapping.py lists the items).
"""

from __future__ import annotations

import keras

from amp_compare.contract.config import RunConfig
from amp_compare.keras_impl import backends, vit
from amp_compare.keras_impl.optimizers import describe_schedule


def describe_defaults() -> dict[str, object]:
    """This Keras' own defaults for each item of amp_compare.contract.mapping.DIFFERENCES, read from fresh objects."""
    adam = keras.optimizers.Adam()
    bn = keras.layers.BatchNormalization()
    scaler = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD())
    conv = keras.layers.Conv2D(1, 3, padding="same")
    return {
        "adam_epsilon": adam.epsilon,
        "bn_momentum": bn.momentum,
        "bn_epsilon": bn.epsilon,
        "stride2_padding": f"padding={conv.padding!r}: extra row/column at bottom/right for even inputs",
        "weight_decay": f"decoupled from the gradient (default {adam.weight_decay})",
        "loss_reduction": keras.losses.SparseCategoricalCrossentropy().reduction,
        "init_scale": scaler.initial_scale,
        "growth_interval": scaler.dynamic_growth_steps,
        "initial_weights": f"{type(conv.kernel_initializer).__name__} kernels, "
                           f"{type(conv.bias_initializer).__name__} biases",
        **vit.describe_defaults(),  # vit: LayerNorm, GELU, attention, AdamW, schedule, token stream
    }


def settings_used(model: keras.Model, optimizer: keras.optimizers.Optimizer, scaler: keras.optimizers.Optimizer,
                  cfg: RunConfig) -> dict:
    """The values this run actually used, read back from the objects it trained with.

    Recorded in Keras' own convention (BatchNorm momentum weights the old average);
    harness/report/settings_check.py maps and compares them with the torch child's. scaler: what
    amp.with_loss_scaling returned, the optimizer itself (a LossScaleOptimizer for fp16). cfg: the twin
    contract's argument (torch reads the autocast dtype from it); Keras reads everything from the live objects.
    """
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    used: dict[str, object] = {"loss_reduction": model.loss.reduction, "weight_decay": inner.weight_decay}
    if isinstance(inner, keras.optimizers.Adam):
        used.update(adam_epsilon=inner.epsilon, adam_beta_1=inner.beta_1, adam_beta_2=inner.beta_2,
                    adam_formula=getattr(inner, "formula", "keras"))
    if isinstance(inner, keras.optimizers.SGD):
        used.update(sgd_momentum=inner.momentum, sgd_nesterov=inner.nesterov)
    used["learning_rate"] = float(keras.ops.convert_to_numpy(inner.learning_rate))
    used["lr_schedule"] = describe_schedule(inner)
    if isinstance(inner, keras.optimizers.Adam) and inner.weight_decay is not None:  # AdamW, or TorchAdam given
        used["adamw_weight_decay"] = float(inner.weight_decay)  # a decay: Adam with decoupled weight decay
    used.update(vit.settings_used(model, cfg))  # vit: LayerNorm eps, GELU form, token stream dtype
    bn = next((layer for layer in model.layers if isinstance(layer, keras.layers.BatchNormalization)), None)
    if bn is not None:
        used.update(bn_momentum=bn.momentum, bn_epsilon=bn.epsilon)
    strided = [layer for layer in model.layers if isinstance(layer, keras.layers.Conv2D)
               and tuple(layer.strides) != (1, 1) and tuple(layer.kernel_size) == (3, 3)]
    if strided:
        names = {layer.name for layer in model.layers}
        padded = {f"{layer.name}_pad" in names and layer.padding == "valid" for layer in strided}
        used["stride2_padding"] = "symmetric" if padded == {True} else f"padding={strided[0].padding!r}"
    used["output_dtype"] = model.layers[-1].dtype_policy.compute_dtype
    if isinstance(scaler, keras.optimizers.LossScaleOptimizer):
        used.update(init_scale=scaler.initial_scale, growth_interval=scaler.dynamic_growth_steps)
    elif inner.loss_scale_factor:
        used["static_loss_scale"] = inner.loss_scale_factor
    used["tf32"] = backends.tf32_state()[0]  # read back from the backend, not from cfg
    return used
