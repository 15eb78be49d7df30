import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from amp_compare.contract import fp8
from amp_compare.contract.config import DATASETS, FRAMEWORKS, MODELS, PRECISIONS, ConfigError, RunConfig
from tests import model_registry


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
        ("precision", "fp4", "valid: fp32, fp16, bf16"),
        ("device", "tpu", "valid: cpu, cuda"),
        ("optimizer", "lion", "valid: auto, adam, adamw, sgd"),
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
    if fp8.plan_error((framework,), (model,), (precision,), set()):  # fp8 on a model/framework it cannot run
        return
    cfg = RunConfig(framework=framework, model=model, dataset=dataset, precision=precision, seed=seed,
                    epochs=epochs, batch_size=batch_size, lr=lr,
                    loss_scale=1024.0 if precision == "fp16-static" else None)
    assert RunConfig.from_json(cfg.to_json()) == cfg
    assert cfg.loss_scaling == {"fp16": "dynamic", "fp16-static": "static"}.get(precision)
    assert (cfg.half is None) == (precision == "fp32" or fp8.is_fp8(precision))


@pytest.mark.parametrize(
    ("field", "value", "needle"),
    [
        ("augment", "false", "true or false"),  # a string is never a boolean
        ("epochs", "3", "positive int"),  # nor a number
        ("epochs", True, "positive int"),
        ("seed", 2**63, "0..9223372036854775807"),  # what the records' int64 columns hold
        ("growth_interval", 2**64, "1..9223372036854775807"),
        ("lr", float("nan"), "finite"),
        ("init_scale", float("inf"), "finite"),
        ("momentum", 1.0, "[0, 1)"),
        ("fp32_layers", "fc", "list"),
        ("fp32_layers", ("fc", "fc"), "more than once"),
    ],
)
def test_strict_types_and_ranges_the_records_can_store(field, value, needle):
    with pytest.raises(ConfigError) as info:
        RunConfig(**{field: value})
    assert needle in str(info.value) and "\n" not in str(info.value)


def test_from_json_is_strict_and_keeps_tuples():
    with pytest.raises(ConfigError, match="augment must be true or false, got 'false'"):
        RunConfig.from_json('{"augment": "false"}')
    cfg = RunConfig.from_json('{"model": "resnet18", "fp32_layers": ["layer1.0.conv1", "fc"], "lr": 1}')
    assert cfg.fp32_layers == ("layer1.0.conv1", "fc") and cfg.lr == 1.0 and isinstance(cfg.lr, float)


def test_every_option_is_declared_once_with_help():
    from amp_compare.harness.run.cli import compare_options

    options = compare_options()
    assert all(d.spec.help for d in options.values())
    assert len({d.flag for d in options.values()}) == len(options)
    assert {"epochs", "seeds", "timeout", "fp32_layers", "loss_scale"} <= set(options)


@pytest.mark.usefixtures("test_models")
@pytest.mark.parametrize("model", model_registry.names())  # every model, the test-only MLP among them
def test_layer_names_are_those_both_real_models_have(model):
    """--fp32-layers is checked in the parent against model_layer_names; it must be exactly the
    block names both frameworks' models share (torch module names, Keras' canonical layer names)."""
    from amp_compare.contract.config import model_layer_names

    torch_models = pytest.importorskip("amp_compare.torch_impl.models")
    pytest.importorskip("tensorflow")
    from amp_compare.keras_impl import models as km
    from amp_compare.keras_impl import numerics as kn

    shape = {"resnet18": (32, 32, 3), "vit": (16, 16, 1)}.get(model, (8, 8, 1))
    torch_names = {n for n, _ in torch_models.build_model(model, shape, 10, width=4).named_modules() if n}
    keras = km.build_model(model, shape, 10, width=4)
    keras_names = {b for layer in kn._layers(keras) for b in kn._block_names(kn.canonical_name(layer))}
    assert set(model_layer_names(model)) == torch_names & keras_names


@pytest.mark.skipif(not hasattr(__import__("os"), "sched_setaffinity"), reason="CPU affinity is Linux-only")
def test_default_threads_are_the_cpus_this_process_may_run_on():
    """Under taskset or a container's cpuset, --threads defaults to what the process may use, not the machine."""
    import os
    import subprocess
    import sys

    code = ("import os; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); "
            "from amp_compare.contract.config import RunConfig; print(RunConfig().threads)")
    from tests.conftest import ROOT

    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}  # tests/conftest.py sets it
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT,
                         env={**env, "PYTHONPATH": str(ROOT)})
    assert out.stdout.strip() == "1"


@pytest.mark.parametrize("value, threads", [("3", 3), ("4,2", 4), (" 5 ", 5), ("0", None), ("many", None),
                                            ("", None)])
def test_default_threads_follow_omp_num_threads_where_it_is_a_positive_integer(monkeypatch, value, threads):
    import os

    monkeypatch.setenv("OMP_NUM_THREADS", value)
    assert RunConfig().threads == (threads or len(os.sched_getaffinity(0)))
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert RunConfig().threads == len(os.sched_getaffinity(0))
