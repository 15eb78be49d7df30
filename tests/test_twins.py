"""The twin contract (contract/twins.py): both framework packages provide its functions with one signature."""

import importlib
import inspect
import types
from pathlib import Path

import pytest

from amp_compare.contract import twins


def package_modules(package: str) -> dict[str, types.ModuleType]:
    return {key: importlib.import_module(f"amp_compare.{package}.{key}") for key in twins.MODULES}


PACKAGES = Path(twins.__file__).parents[1]


@pytest.mark.parametrize("package, library", [("torch_impl", "torch"), ("keras_impl", "keras")])
def test_each_framework_package_keeps_the_contract(package, library):
    pytest.importorskip(library)
    assert twins.mismatches(package_modules(package)) == []
    for key in twins.SOURCE_MODULES:
        source = (PACKAGES / package / f"{key}.py").read_text()
        assert twins.source_mismatches(key, f"{package}.{key}", source) == []


def test_the_contract_covers_every_twin_module():
    """Every module both framework packages have is a twin pair the contract checks, and nothing else is listed."""
    names = [{f.stem for f in (PACKAGES / package).glob("*.py")} - {"__init__", "__main__"}
             for package in ("torch_impl", "keras_impl")]
    assert sorted(twins.TWIN_MODULES) == sorted(names[0] & names[1])
    assert set(twins.PROTOCOLS) == set(twins.MODULES) and not set(twins.MODULES) & set(twins.SOURCE_MODULES)


def test_functions_of_one_name_keep_one_signature_in_both_twins():
    """A public function both twins of a module define has one signature, unless OWN_SIGNATURES says why not."""
    pytest.importorskip("torch")
    pytest.importorskip("keras")
    assert twins.shared_mismatches(package_modules("torch_impl"), package_modules("keras_impl")) == []


def _keeping(protocol: type, name: str):
    """A module-level function with exactly the signature the Protocol declares (less self)."""
    sig = inspect.signature(getattr(protocol, name))

    def function(*args, **kwargs):
        return None

    function.__signature__ = sig.replace(parameters=list(sig.parameters.values())[1:])
    return function


def test_the_contract_check_sees_a_drift():
    """A missing function, a renamed or added parameter, a changed default: each is named."""
    modules = {key: types.ModuleType(f"fake.{key}") for key in twins.MODULES}
    for key, protocol in twins.PROTOCOLS.items():
        for name in [n for n in vars(protocol) if not n.startswith("_") and callable(getattr(protocol, n))]:
            setattr(modules[key], name, _keeping(protocol, name))
    assert twins.mismatches(modules) == []

    modules["amp"].current_scale = lambda scaler, device: None  # torch's signature before the contract
    modules["train"].make_dataset = lambda data, plan: None  # Keras' signature before the contract
    modules["numerics"].gradient_underflow = lambda model, x, y, precision, loss_scale, loss_weight=2.0: None
    del modules["probe"].limit_gpu
    found = twins.mismatches(modules)
    assert [line.split("(")[0].split(":")[0] for line in found] == [
        "fake.amp.current_scale", "fake.train.make_dataset", "fake.numerics.gradient_underflow",
        "fake.probe.limit_gpu"], found
    assert "loss_weight=2.0" in found[2] and "loss_weight=1.0" in found[2] and found[3].endswith("missing")


def test_the_shared_name_check_sees_a_drift():
    """Two twins' functions of one name: another parameter is named, a framework's own helper is not, and
    OWN_SIGNATURES' functions may differ; an entry module without a name the child reads is named."""
    torch_side = {key: types.ModuleType(f"t.{key}") for key in twins.MODULES}
    keras_side = {key: types.ModuleType(f"k.{key}") for key in twins.MODULES}

    def define(module, name, function):
        function.__module__, function.__name__ = module.__name__, name
        setattr(module, name, function)

    define(torch_side["vit"], "settings_used", lambda model, cfg: {})
    define(keras_side["vit"], "settings_used", lambda model, cfg: {})
    define(torch_side["loop"], "run_epoch", lambda net, plan: 0)  # torch's alone: no twin to match
    define(torch_side["amp"], "train_step", lambda model, optimizer, x, y: None)
    define(keras_side["amp"], "train_step", lambda model, x, y: None)  # listed in OWN_SIGNATURES
    assert twins.shared_mismatches(torch_side, keras_side) == []
    define(keras_side["vit"], "settings_used", lambda model: {})
    assert twins.shared_mismatches(torch_side, keras_side) == ["vit.settings_used: (model, cfg) against (model)"]
    assert twins.source_mismatches("entry", "x.entry", "TRAIN_MODULE = 'm'\nPRELOAD: tuple = ()\n") == []
    assert twins.source_mismatches("entry", "x.entry", "TRAIN_MODULE = 'm'\n") == ["x.entry.PRELOAD: missing"]


def test_step_book_locates_the_first_bad_step_once_at_the_scale_it_used():
    """Both loops hand host values to kit/training.StepBook: the locator runs once, for the first skipped or
    non-finite step, with that step's own batch position and loss scale (not the scale after the backoff)."""
    import io

    from amp_compare.contract.config import RunConfig
    from amp_compare.kit.child import Progress, TrainResult
    from amp_compare.kit.training import StepBook

    calls = []
    cfg = RunConfig(batch_size=4, epochs=2, diverge_after=3)
    book = StepBook(cfg, TrainResult(), Progress(stream=io.StringIO()), lambda: {},
                    lambda epoch, batch, scale: calls.append((epoch, batch, scale)) or {"where": "backward"})
    book.start_epoch(0, 3)
    assert not book.add([1.0, 2.0], [8.0, 8.0], [False, False])
    assert not book.add([1.5], [8.0], [False])
    book.end_epoch([0.1] * 3, 0.3, 0.05, correct=6, val_loss=1.0, val_accuracy=0.5)
    book.start_epoch(1, 3)
    assert not book.add([2.0, float("nan")], [8.0, 4.0], [True, True])  # two bad steps read at once
    assert calls == [(1, 0, 8.0)]  # the first, at its own scale; not again for the second
    assert book.result.nonfinite == {"step": 3, "where": "backward"}
    assert book.add([float("inf"), float("nan")], [2.0, 1.0], [True, True])  # 3 non-finite losses in a row
    assert book.result.diverged_at_step == 4 and calls == [(1, 0, 8.0)]
    row = book.result.epochs[0]
    assert row["train_accuracy"] == 6 / (3 * 4) and row["train_loss"] == 1.5 and row["train_time_s"] == 0.3
    assert book.result.step_epoch == [0, 0, 0, 1, 1, 1, 1] and book.result.step_skipped[3:] == [True] * 4


def test_a_cell_is_built_in_one_order():
    """kit/build.py: make_model, then the shared weights into the unconverted model, then fp8, then compile on the
    converted model; the probe (no shared weights) skips the load alone."""
    from amp_compare.kit.build import build

    calls = []

    class Shared:
        def apply(self, model, get_weights, set_weights):
            calls.append(("weights", model))
            set_weights(model, get_weights(model))
            return "shared file"

    steps = dict(make_model=lambda cfg, data: calls.append("make") or "built",
                 get_weights=lambda model: calls.append("get") or {}, set_weights=lambda model, w: calls.append("set"),
                 convert_fp8=lambda model, cfg: calls.append(("fp8", model)) or "converted",
                 compile=lambda model: calls.append(("compile", model)) or "compiled")
    built = build("cfg", "data", Shared(), **steps)
    assert calls == ["make", ("weights", "built"), "get", "set", ("fp8", "built"), ("compile", "converted")]
    assert built == ("converted", "compiled", "shared file")
    calls.clear()
    assert build("cfg", "data", None, **steps).model == "converted" and "get" not in calls
