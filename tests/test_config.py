import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from common.config import DATASETS, FRAMEWORKS, MODELS, PRECISIONS, ConfigError, RunConfig


def test_defaults_are_valid_and_round_trip_through_json():
    cfg = RunConfig()
    assert RunConfig.from_json(cfg.to_json()) == cfg
    assert cfg.cell_id == "torch-simple_cnn-digits-fp32-s0"


@pytest.mark.parametrize(
    ("field", "value", "needle"),
    [
        ("framework", "jax", "valid: torch, tf"),
        ("model", "vgg", "valid: simple_cnn"),
        ("dataset", "imagenet", "valid: digits"),
        ("precision", "fp8", "valid: fp32, fp16, bf16"),
        ("device", "tpu", "valid: cpu, cuda"),
        ("optimizer", "lion", "valid: adam, sgd"),
        ("epochs", 0, "positive"),
        ("batch_size", -4, "positive"),
        ("steps_per_epoch", 0, "positive"),
        ("lr", 0.0, "positive"),
        ("seed", -1, "non-negative"),
    ],
)
def test_bad_values_name_value_and_choices(field, value, needle):
    with pytest.raises(ConfigError) as info:
        RunConfig(**{field: value})
    message = str(info.value)
    assert repr(value) in message and needle in message and "\n" not in message


def test_unknown_key_and_malformed_json_are_config_errors():
    with pytest.raises(ConfigError, match="unknown config key"):
        RunConfig.from_dict({"epochs": 1, "color": "red"})
    with pytest.raises(ConfigError, match="malformed config JSON"):
        RunConfig.from_json("{not json")
    with pytest.raises(ConfigError, match="must be an object"):
        RunConfig.from_json(json.dumps([1, 2]))


@given(
    framework=st.sampled_from(FRAMEWORKS), model=st.sampled_from(MODELS), dataset=st.sampled_from(DATASETS),
    precision=st.sampled_from(PRECISIONS), seed=st.integers(0, 2**31), epochs=st.integers(1, 1000),
    batch_size=st.integers(1, 4096), lr=st.floats(1e-8, 10.0),
)
def test_any_valid_config_round_trips(framework, model, dataset, precision, seed, epochs, batch_size, lr):
    cfg = RunConfig(framework=framework, model=model, dataset=dataset, precision=precision, seed=seed,
                    epochs=epochs, batch_size=batch_size, lr=lr,
                    loss_scale=1024.0 if precision == "fp16-static" else None)
    assert RunConfig.from_json(cfg.to_json()) == cfg
    assert cfg.loss_scaling == {"fp16": "dynamic", "fp16-static": "static"}.get(precision)
    assert (cfg.half is None) == (precision == "fp32")
