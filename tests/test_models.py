"""The two implementations of each model have the same layers and parameter counts."""

import pytest

MODELS = {"simple_cnn": [("conv1", 320), ("conv2", 18496), ("fc", 10250)]}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_parameter_counts_match_layer_by_layer(name):
    from tf_impl.models import build_model as build_keras
    from torch_impl.models import build_model as build_torch

    torch_model = build_torch(name, (16, 16, 1), 10)
    keras_model = build_keras(name, (16, 16, 1), 10)
    torch_counts = [(n, sum(p.numel() for p in m.parameters())) for n, m in torch_model.named_children()
                    if any(True for _ in m.parameters())]
    keras_counts = [(layer.name, layer.count_params()) for layer in keras_model.layers if layer.count_params()]
    assert torch_counts == keras_counts == MODELS[name]
    assert sum(p.numel() for p in torch_model.parameters()) == keras_model.count_params()


def test_keras_logits_are_float32_under_mixed_policy():
    import keras

    from tf_impl.models import build_model

    keras.config.set_dtype_policy("mixed_float16")
    try:
        model = build_model("simple_cnn", (16, 16, 1), 10)
        assert model.get_layer("conv1").compute_dtype == "float16"
        assert model.get_layer("fc").compute_dtype == "float32"
        assert model.output.dtype == "float32"
    finally:
        keras.config.set_dtype_policy("float32")
