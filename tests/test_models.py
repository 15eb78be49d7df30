"""The two implementations of each model have the same layers and parameter counts, and weights move between them."""

import numpy as np
import pytest

from amp_compare.kit import weights as cw
from tests import model_registry

pytestmark = pytest.mark.usefixtures("test_models")  # every registered model, the test-only MLP among them

SIMPLE_CNN = [("conv1", 320), ("conv2", 18496), ("fc", 10250)]
VIT = {"dim": 16, "depth": 2, "heads": 2, "patch": 4, "mlp_ratio": 2}
SIZES = {"vit": {"vit": VIT}}  # a vit of 2 narrow blocks; the others at their spec's example size
CASES = {name: (model_registry.example_shape(name), SIZES.get(name, model_registry.example_build(name)))
         for name in model_registry.names()}
RESNET18_CIFAR_PARAMS = 11_173_962  # the usual count for CIFAR ResNet-18: width 64, 10 classes
VIT_LAYERS = 14
RESNET18_LAYERS = 41  # stem conv + BN, 8 blocks x (2 conv + 2 BN), 3 projection shortcuts x (conv + BN), fc


def build_both(name, **kwargs):
    from amp_compare.keras_impl.models import build_model as build_keras
    from amp_compare.torch_impl.models import build_model as build_torch

    shape, defaults = CASES[name]
    kwargs = {**defaults, **kwargs}
    return build_torch(name, shape, 10, **kwargs), build_keras(name, shape, 10, **kwargs)


def build_keras(name, **kwargs):
    from amp_compare.keras_impl.models import build_model

    shape, defaults = CASES[name]
    return build_model(name, shape, 10, **{**defaults, **kwargs})


def values(model) -> dict[str, np.ndarray]:
    """Keras' own weights, in Keras layout (not the vit's headroom recorders)."""
    import keras

    return {v.path: keras.ops.convert_to_numpy(v) for v in model.weights if v.name not in cw.RECORDERS}


def torch_layers(model) -> list[tuple[str, int, int]]:
    """(Keras name, trainable, non-trainable) for each module holding weights; buffers count as non-trainable.
    An attention's four projections count towards the attention (Keras' MultiHeadAttention holds its own)."""
    rows: dict[str, list[int]] = {}
    for name, module in model.named_modules():
        params = sum(p.numel() for p in module.parameters(recurse=False))
        buffers = sum(b.numel() for n, b in module.named_buffers(recurse=False) if n not in cw.SKIPPED)
        parent, _, part = name.rpartition(".")
        if parent.endswith(".attn") and part in cw.MHA_TO_KERAS:
            name = parent
        if params or buffers:
            row = rows.setdefault(cw.keras_layer_name(name), [0, 0])
            row[0] += params
            row[1] += buffers
    return sorted((name, t, n) for name, (t, n) in rows.items())


def keras_layers(model) -> list[tuple[str, int, int]]:
    def size(variables):
        return sum(int(np.prod(v.shape)) for v in variables)

    return sorted((layer.name, size(layer.trainable_weights), size(layer.non_trainable_weights))
                  for layer in model.layers if layer.weights)


def randomised(weights: dict[str, np.ndarray], seed: int = 0) -> dict[str, np.ndarray]:
    """Every array replaced (BatchNorm statistics included), so no value can pass by being a default."""
    rng = np.random.default_rng(seed)
    return {k: rng.uniform(0.5, 1.5, v.shape).astype(np.float32) for k, v in weights.items()}


@pytest.mark.parametrize("name", sorted(CASES))
def test_parameter_counts_match_layer_by_layer(name):
    torch_model, keras_model = build_both(name)
    assert torch_layers(torch_model) == keras_layers(keras_model)
    assert sum(p.numel() for p in torch_model.parameters()) == sum(t for _, t, _ in keras_layers(keras_model))
    if name == "simple_cnn":
        assert [(n, trainable) for n, trainable, _ in torch_layers(torch_model)] == SIMPLE_CNN
    elif name == "vit":  # patch, embed, 2 x (ln1, attn, ln2, fc1, fc2), norm, fc
        assert len(torch_layers(torch_model)) == VIT_LAYERS
        assert dict((n, t) for n, t, _ in torch_layers(torch_model))["blocks_0_attn"] == 4 * (16 * 16 + 16)
    elif name == "resnet18":
        assert len(torch_layers(torch_model)) == RESNET18_LAYERS


def test_full_width_resnet18_has_the_usual_parameter_count():
    torch_model, keras_model = build_both("resnet18", width=64)
    assert sum(p.numel() for p in torch_model.parameters()) == RESNET18_CIFAR_PARAMS
    assert sum(int(np.prod(v.shape)) for v in keras_model.trainable_weights) == RESNET18_CIFAR_PARAMS


@pytest.mark.parametrize("name", sorted(CASES))
def test_torch_weights_round_trip_through_keras(name):
    from amp_compare.keras_impl.models import get_weights as keras_get
    from amp_compare.keras_impl.models import set_weights as keras_set
    from amp_compare.torch_impl.models import get_weights as torch_get
    from amp_compare.torch_impl.models import set_weights as torch_set

    torch_model, keras_model = build_both(name)
    torch_set(torch_model, randomised(torch_get(torch_model)))
    original = torch_get(torch_model)
    assert not any(k.endswith("num_batches_tracked") for k in original)
    keras_set(keras_model, original)
    back = keras_get(keras_model)
    assert back.keys() == original.keys()
    for key, value in original.items():
        assert back[key].dtype == np.float32
        np.testing.assert_array_equal(back[key], value, err_msg=key)  # layout changes are exact


@pytest.mark.parametrize("name", sorted(CASES))
def test_keras_weights_round_trip_through_torch(name):
    from amp_compare.keras_impl.models import get_weights as keras_get
    from amp_compare.keras_impl.models import set_weights as keras_set
    from amp_compare.torch_impl.models import get_weights as torch_get
    from amp_compare.torch_impl.models import set_weights as torch_set

    torch_model, keras_model = build_both(name)
    for variable in keras_model.weights:  # randomise Keras' own variables, in Keras layout
        variable.assign(np.random.default_rng(len(variable.path)).uniform(0.5, 1.5, variable.shape))
    original = values(keras_model)
    torch_set(torch_model, keras_get(keras_model))
    fresh = build_keras(name)
    keras_set(fresh, torch_get(torch_model))
    back = values(fresh)
    assert back.keys() == original.keys()
    for path, value in original.items():
        np.testing.assert_array_equal(back[path], value, err_msg=path)


def test_set_weights_rejects_missing_and_misshapen_weights():
    from amp_compare.keras_impl.models import set_weights as keras_set
    from amp_compare.torch_impl.models import get_weights as torch_get
    from amp_compare.torch_impl.models import set_weights as torch_set

    torch_model, keras_model = build_both("resnet18")
    weights = torch_get(torch_model)
    missing = {k: v for k, v in weights.items() if k != "layer2.0.downsample.1.running_var"}
    misshapen = {**weights, "fc.weight": weights["fc.weight"][:, :-1]}
    for set_weights, model in ((torch_set, torch_model), (keras_set, keras_model)):
        with pytest.raises(KeyError, match="layer2.0.downsample.1"):
            set_weights(model, missing)
        with pytest.raises(ValueError, match="fc"):
            set_weights(model, misshapen)


def test_layout_conversions_are_the_framework_conventions():
    """Framework-free: the kernels computed by hand in each layout give the same numbers."""
    rng = np.random.default_rng(0)
    activation = rng.normal(size=(6, 3, 2))  # (C, H, W), as torch holds one image
    weight = rng.normal(size=(4, 6 * 3 * 2))  # torch Linear (out, in) after flatten of (C, H, W)
    kernel = cw.dense_kernel_to_keras(weight, (6, 3, 2))
    np.testing.assert_allclose(activation.transpose(1, 2, 0).reshape(-1) @ kernel, weight @ activation.reshape(-1))
    np.testing.assert_array_equal(cw.dense_kernel_to_torch(kernel, (6, 3, 2)), weight)
    conv = rng.normal(size=(5, 2, 3, 3))  # (O, I, H, W)
    hwio = cw.conv_kernel_to_keras(conv)
    assert hwio[1, 2, 0, 4] == conv[4, 0, 1, 2]
    np.testing.assert_array_equal(cw.conv_kernel_to_torch(hwio), conv)
    canonical = {"conv.weight": conv, "bn.weight": rng.normal(size=5), "bn.bias": rng.normal(size=5),
                 "bn.running_mean": rng.normal(size=5), "bn.running_var": rng.uniform(size=5),
                 "bn.num_batches_tracked": np.array(3), "fc.weight": weight, "fc.bias": rng.normal(size=4)}
    keras_side = cw.to_keras(canonical, {"fc": (6, 3, 2)})
    assert sorted(keras_side["bn"]) == ["beta", "gamma", "moving_mean", "moving_variance"]
    back = cw.to_torch(keras_side, {"fc": (6, 3, 2)})
    assert back.keys() == canonical.keys() - {"bn.num_batches_tracked"}
    for key, value in back.items():
        np.testing.assert_array_equal(value, canonical[key], err_msg=key)
    with pytest.raises(ValueError, match="'_'"):
        cw.keras_layer_name("layer_1.conv")


def test_model_options_reach_the_layers():
    import keras

    torch_model, keras_model = build_both("resnet18", bn_momentum=0.1, bn_epsilon=1e-5)
    assert (torch_model.bn1.momentum, torch_model.bn1.eps) == (0.1, 1e-5)
    torch_default, keras_default = build_both("resnet18")
    fresh = keras.layers.BatchNormalization()
    assert (keras_default.get_layer("bn1").momentum, keras_default.get_layer("bn1").epsilon) == (
        fresh.momentum, fresh.epsilon)  # None: the framework's own default, not a value of ours
    assert torch_default.bn1.momentum == 0.1 and torch_default.bn1.eps == 1e-5
    same = build_keras("resnet18", stride2_padding="same")
    padded = [layer.name for layer in keras_default.layers if isinstance(layer, keras.layers.ZeroPadding2D)]
    assert padded == ["layer2_0_conv1_pad", "layer3_0_conv1_pad", "layer4_0_conv1_pad"]
    assert not any(isinstance(layer, keras.layers.ZeroPadding2D) for layer in same.layers)
    assert keras_layers(same) == keras_layers(keras_default)


def test_resnet18_same_padding_shifts_the_stride2_convolutions():
    """'same' pads an even input only bottom/right: other outputs than torch's padding=1 ('defaults' mode)."""
    from amp_compare.keras_impl.models import get_weights, set_weights

    symmetric, same = build_keras("resnet18"), build_keras("resnet18", stride2_padding="same")
    set_weights(same, get_weights(symmetric))
    x = np.random.default_rng(0).normal(size=(2, 16, 16, 3)).astype(np.float32)
    assert np.abs(same.predict(x, verbose=0) - symmetric.predict(x, verbose=0)).max() > 1e-4


def test_keras_logits_are_float32_under_mixed_policy():
    import keras

    from amp_compare.keras_impl.models import build_model

    keras.config.set_dtype_policy("mixed_float16")
    try:
        for name, (shape, kwargs) in CASES.items():
            model = build_model(name, shape, 10, **kwargs)
            assert model.get_layer(model_registry.spec(name).blocks[0]).compute_dtype == "float16"
            assert model.get_layer("fc").compute_dtype == "float32"
            assert model.output.dtype == "float32"
    finally:
        keras.config.set_dtype_policy("float32")
