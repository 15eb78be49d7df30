"""fp8 on the runtime path: each framework's converted ViT layers reproduce a float64 reference of their own recipe.

One training step of the ViT (the cell's make_model + the fp8 conversion a compare run does), every converted
layer's tensors captured by the same functions the child's numerics lab calls (torch_impl/fp8.capture_step,
keras_impl/fp8.capture_step), then compared with kit/fp8.linear_reference: inputs and kernels quantized to e4m3,
output gradients to the recipe's format, each with the recipe's scale, the matmuls accumulated in float64. A
layer that ran its recipe agrees to float32 rounding; a wrong format, a scale not applied or a layer left in
float32 is off by fp8's rounding (~1e-2 relative). The live settings must equal contract/fp8.py's declaration.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from amp_compare.contract import fp8 as contract  # noqa: E402
from amp_compare.contract.config import RunConfig  # noqa: E402
from amp_compare.kit import fp8 as ref  # noqa: E402
from amp_compare.kit.data import load_dataset  # noqa: E402

VIT = {"vit_dim": 16, "vit_depth": 1, "vit_heads": 2, "vit_patch": 4}
BATCH = 8
EXPECTED = sorted(f"blocks.0.{m}" for m in ("attn.query", "attn.key", "attn.value", "attn.out", "mlp.fc1",
                                             "mlp.fc2")) + ["fc"]
RTOL = 2e-5  # float32 accumulation against float64, relative to each product's scale


@pytest.fixture(scope="module")
def data():
    return load_dataset("digits")


def config(framework: str, precision: str, **overrides) -> RunConfig:
    return RunConfig(framework=framework, model="vit", dataset="digits", precision=precision, batch_size=BATCH,
                     epochs=1, steps_per_epoch=1, **{**VIT, **overrides})


def assert_reference(captured: dict, recipe, scales: dict | None = None) -> None:
    """Every captured layer's output, input gradient and kernel gradient against the recipe's float64 reference."""
    for name, t in captured.items():
        expected = ref.linear_reference(recipe, t["input"], t["kernel"], t["grad_output"],
                                        None if scales is None else scales[name])
        expected["output"] = expected["output"] + (0 if t["bias"] is None else t["bias_as_added"])
        for key in ("output", "grad_input", "grad_kernel"):
            got, want = t[key], expected[key]
            err = np.max(np.abs(got - want)) / max(np.max(np.abs(want)), 1e-30)
            assert err < RTOL, f"{name} {key}: {err:.2e} relative to its largest value (recipe {recipe.precision})"


def torch_step(cfg: RunConfig, data):
    import torch

    from amp_compare.torch_impl import fp8
    from amp_compare.torch_impl import train as pt

    torch.manual_seed(0)
    model = fp8.convert(pt.make_model(cfg, data), cfg)  # as kit/build.py: after make_model
    x = torch.from_numpy(data.x_train[:BATCH]).permute(0, 3, 1, 2).contiguous()
    captured = fp8.capture_step(model, x, torch.from_numpy(data.y_train[:BATCH]))
    for t in captured.values():
        t["bias_as_added"] = t["bias"]
    return model, captured


@pytest.mark.parametrize("precision", ["fp8", "fp8-rowwise"])
def test_torch_layers_follow_their_recipe(precision, data):
    from amp_compare.torch_impl import fp8

    model, captured = torch_step(config("torch", precision), data)
    recipe = contract.recipe("torch", precision)
    assert sorted(captured) == EXPECTED, f"layers in fp8: {sorted(captured)}"
    assert_reference(captured, recipe)
    live = fp8.settings(model)
    for key in ("scaling", "granularity", "amax_history", "power_of_2_scales", "scale_convention"):
        assert live[key] == getattr(recipe, key), f"{key}: live {live[key]!r}, declared {getattr(recipe, key)!r}"
    assert live["formats"] == list(recipe.formats)
    assert live["module"] == "torchao.float8.float8_linear.Float8Linear"  # what the report names as the API


@pytest.mark.parametrize("precision, name", [("fp8", "tensorwise"), ("fp8-rowwise", "rowwise")])
def test_torch_recipe_is_torchaos_own(precision, name):
    """contract/fp8.py's torch rows, built into a Float8LinearConfig, are torchao's named recipes."""
    import dataclasses

    from torchao.float8 import Float8LinearConfig

    from amp_compare.torch_impl import fp8

    assert fp8._config(config("torch", precision)) == dataclasses.replace(
        Float8LinearConfig.from_recipe_name(name), emulate=True)


def test_fp32_layers_stay_out_of_fp8(data):
    """--fp32-layers keeps a block out of fp8 in both frameworks (the torch side here, Keras below)."""
    _, captured = torch_step(config("torch", "fp8", fp32_layers=("blocks.0.mlp",)), data)
    assert sorted(captured) == [n for n in EXPECTED if not n.startswith("blocks.0.mlp")]


def keras_model(cfg: RunConfig, data):
    import keras

    from amp_compare.keras_impl import amp, fp8
    from amp_compare.keras_impl import train as kt

    keras.utils.set_random_seed(0)
    amp.mixed_precision(cfg.precision)
    model = fp8.convert(kt.make_model(cfg, data), cfg)
    kt.compile_model(cfg, model)
    return model


def test_keras_layers_follow_their_recipe(data):
    """Keras' delayed recipe after two fitted steps (so its scales come from the amax history, not 1.0)."""
    import keras

    from amp_compare.keras_impl import fp8

    cfg = config("tf", "fp8")
    model = keras_model(cfg, data)
    model.fit(data.x_train[:2 * BATCH], data.y_train[:2 * BATCH], batch_size=BATCH, epochs=1, verbose=0,
              shuffle=False)
    recipe = contract.recipe("tf", "fp8")
    layers = fp8.converted(model)
    scales = {name: fp8.live_scales(layer) for name, layer in layers.items()}
    assert all(s["input"] != 1.0 for s in scales.values()), "the amax history never set a scale"
    captured = fp8.capture_step(model, data.x_train[:BATCH], data.y_train[:BATCH])
    assert sorted(captured) == EXPECTED, f"layers in fp8: {sorted(captured)}"
    for t in captured.values():  # Keras adds a float32 bias through bfloat16 in float8 mode (dense.py)
        t["bias_as_added"] = None if t["bias"] is None else np.asarray(
            keras.ops.convert_to_numpy(keras.ops.cast(keras.ops.cast(t["bias"], "bfloat16"), "float32")))
    assert_reference(captured, recipe, scales)
    live = fp8.settings(model)
    for key in ("scaling", "granularity", "amax_history", "scale_convention"):
        assert live[key] == getattr(recipe, key), f"{key}: live {live[key]!r}, declared {getattr(recipe, key)!r}"
    assert live["formats"] == list(recipe.formats)
    # delayed: the scale a step uses is the largest amax of the steps before it (the history without its newest
    # entry, at index 0) over fmax
    for name, layer in layers.items():
        history = keras.ops.convert_to_numpy(layer.inputs_amax_history)
        assert np.isclose(fp8.live_scales(layer)["input"], np.max(history[1:]) / contract.FP8_MAX["float8_e4m3fn"],
                          rtol=1e-6), name


def test_keras_fp32_layers_and_rowwise(data):
    from amp_compare.keras_impl import fp8
    from amp_compare.kit.child import Unavailable

    model = keras_model(config("tf", "fp8", fp32_layers=("blocks.0.attn",)), data)
    assert sorted(fp8.converted(model)) == [n for n in EXPECTED if not n.startswith("blocks.0.attn")]
    with pytest.raises(Unavailable, match="no fp8-rowwise recipe"):
        fp8.convert(model, config("tf", "fp8-rowwise"))
