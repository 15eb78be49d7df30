"""Mixed-precision numerics observed in both frameworks: per-layer dtypes, float32 overrides,
gradient underflow and the NaN/Inf locator (torch_impl/numerics.py beside keras_impl/numerics.py).

The assertions record what this torch and this Keras actually do on CPU. Models are tiny
(float16 is emulated on this CPU) and, where the frameworks are compared, share weights.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

keras = pytest.importorskip("keras")
tf = pytest.importorskip("tensorflow")
torch = pytest.importorskip("torch")

from amp_compare.keras_impl import models as km  # noqa: E402
from amp_compare.keras_impl import numerics as kn  # noqa: E402
from amp_compare.keras_impl.amp import mixed_precision  # noqa: E402
from amp_compare.keras_impl.loop import AmpModel  # noqa: E402
from amp_compare.kit.fp16 import underflow_summary  # noqa: E402
from amp_compare.torch_impl import models as pm  # noqa: E402
from amp_compare.torch_impl import numerics as tn  # noqa: E402
from tests import model_registry  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
# Every registered model (tests/model_registry.py: the test-only MLP among them) on its example's image shape:
# simple_cnn (16, 16, 1), resnet18 (16, 16, 3). The vit's audit and underflow rows have their own tests (below).
pytestmark = pytest.mark.usefixtures("test_models")
MODELS = [name for name in model_registry.names() if "vit" not in model_registry.spec(name).hooks]
SHAPES = {name: model_registry.example_shape(name) for name in MODELS}
WIDTH, BATCH, CLASSES = 4, 8, 10
HALF = {"fp16": "float16", "bf16": "bfloat16"}


@pytest.fixture(autouse=True)
def float32_policy():
    """Each test builds its Keras models under the policy it needs; the global one is float32 in between."""
    keras.config.set_dtype_policy("float32")
    yield
    keras.config.set_dtype_policy("float32")


def batch(name: str, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """NHWC images in [0, 1) and labels, as kit/data.py serves them."""
    rng = np.random.default_rng(seed)
    return rng.random((BATCH, *SHAPES[name]), dtype=np.float32), rng.integers(0, CLASSES, BATCH)


def torch_batch(x: np.ndarray, y: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.from_numpy(x).permute(0, 3, 1, 2).contiguous(), torch.from_numpy(y)


def build_torch(name: str, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return pm.build_model(name, SHAPES[name], CLASSES, width=WIDTH)


def build_keras(name: str, precision: str, weights: dict[str, np.ndarray] | None = None) -> keras.Model:
    """An AmpModel built under the precision's policy (then float32 again), optionally with canonical weights."""
    mixed_precision(precision)
    try:
        model = km.build_model(name, SHAPES[name], CLASSES, model_class=AmpModel, width=WIDTH)
    finally:
        keras.config.set_dtype_policy("float32")
    if weights is not None:
        km.set_weights(model, weights)
    return model


def build_pair(name: str, precision: str) -> tuple[torch.nn.Module, keras.Model]:
    torch_model = build_torch(name)
    return torch_model, build_keras(name, precision, pm.get_weights(torch_model))


def dtype_of(rows: list[dict], op: str, phase: str = "forward") -> dict[str, str]:
    """{layer: compute dtype} of one op; fails if a layer ran it in two dtypes."""
    out: dict[str, str] = {}
    for r in rows:
        if r["op"] == op and r["phase"] == phase:
            assert out.setdefault(r["layer"], r["compute_dtype"]) == r["compute_dtype"], (r, out)
    return out


def layer_dtypes(rows: list[dict], layer: str, phase: str = "forward") -> set[str]:
    return {r["compute_dtype"] for r in rows if r["layer"] == layer and r["phase"] == phase}


def leaf_modules(model: torch.nn.Module) -> set[str]:
    return {name for name, m in model.named_modules() if name and not list(m.children())}


def keras_names(model: keras.Model, cls=None) -> set[str]:
    return {kn.canonical_name(layer) for layer in model.layers
            if not isinstance(layer, keras.layers.InputLayer) and (cls is None or isinstance(layer, cls))}


# ---------------------------------------------------------------------------------------------
# dtype audit
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_torch_audit_simple_cnn(precision):
    model = build_torch("simple_cnn")
    rows = tn.dtype_audit(model, *torch_batch(*batch("simple_cnn")), precision)
    half = HALF[precision]
    assert leaf_modules(model) - {"flatten"} | {"loss"} == {r["layer"] for r in rows}  # flatten: a view
    assert {r["phase"] for r in rows} == {"forward", "backward"}
    # autocast runs conv and linear in half precision, forward and backward...
    assert dtype_of(rows, "convolution") == {"conv1": half, "conv2": half}
    assert dtype_of(rows, "convolution_backward", "backward") == {"conv1": half, "conv2": half}
    assert dtype_of(rows, "addmm") == {"fc": half}
    assert dtype_of(rows, "mm", "backward") == {"fc": half}
    # ...and cross-entropy in float32: the half logits are cast up, the gradient cast back down.
    assert dtype_of(rows, "_log_softmax") == dtype_of(rows, "nll_loss_forward") == {"loss": "float32"}
    assert dtype_of(rows, "_log_softmax_backward_data", "backward") == {"loss": "float32"}
    assert dtype_of(rows, "_to_copy", "backward")["loss"] == half
    # The parameters stay float32: autocast casts a half copy in, and the gradient back out.
    assert {r["param_dtype"] for r in rows if r["layer"] in ("conv1", "conv2", "fc")} == {"float32"}
    assert {r["param_dtype"] for r in rows if r["layer"] in ("loss", "relu1", "pool1")} == {""}
    assert dtype_of(rows, "_to_copy", "backward")["conv1"] == "float32"


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_keras_audit_simple_cnn(precision):
    model = build_keras("simple_cnn", precision)
    rows = kn.dtype_audit(model, *batch("simple_cnn"), precision)
    half = HALF[precision]
    # Flatten only reshapes: skipped, as torch's audit skips views
    assert keras_names(model) - {"flatten"} | {"loss"} == {r["layer"] for r in rows}
    assert dtype_of(rows, "Conv2D") == {"conv1": half, "conv2": half}
    assert dtype_of(rows, "Conv2DBackpropFilter", "backward") == {"conv1": half, "conv2": half}
    # The last Dense is float32 by construction (keras_impl/models.py), so are the logits and the loss.
    assert dtype_of(rows, "MatMul") == {"fc": "float32"}
    assert dtype_of(rows, "SparseSoftmaxCrossEntropyWithLogits") == {"loss": "float32"}
    assert layer_dtypes(rows, "loss") == layer_dtypes(rows, "loss", "backward") == {"float32"}
    # Variables stay float32 and each layer computes in its policy's compute dtype.
    assert {r["param_dtype"] for r in rows if r["layer"] in ("conv1", "conv2", "fc")} == {"float32"}
    for layer in model.layers[1:]:
        assert layer.variable_dtype == "float32"
        if isinstance(layer, keras.layers.Flatten):
            continue
        main_ops = {r["compute_dtype"] for r in rows if r["layer"] == kn.canonical_name(layer)
                    and r["phase"] == "forward" and r["op"] in ("Conv2D", "MatMul", "MaxPool", "Relu")}
        assert main_ops == {layer.compute_dtype}, layer.name


def test_fp32_audits_are_float32_throughout():
    x, y = batch("simple_cnn")
    torch_rows = tn.dtype_audit(build_torch("simple_cnn"), *torch_batch(x, y), "fp32")
    keras_rows = kn.dtype_audit(build_keras("simple_cnn", "fp32"), x, y, "fp32")
    assert {r["compute_dtype"] for r in torch_rows + keras_rows} == {"float32"}
    assert not [r for r in torch_rows if r["op"] == "_to_copy"]  # no autocast, no casts


def test_batchnorm_and_reductions_differ_under_fp16():
    """resnet18, fp16: where the frameworks put BatchNorm and the average pool."""
    x, y = batch("resnet18")
    torch_model, keras_model = build_pair("resnet18", "fp16")
    before = {k: v.clone() for k, v in torch_model.state_dict().items()}
    keras_before = [v.numpy() for v in keras_model.non_trainable_variables]
    torch_rows = tn.dtype_audit(torch_model, *torch_batch(x, y), "fp16")
    keras_rows = kn.dtype_audit(keras_model, x, y, "fp16")
    torch_bn = {n for n, m in torch_model.named_modules() if isinstance(m, torch.nn.BatchNorm2d)}
    keras_bn = keras_names(keras_model, keras.layers.BatchNormalization)
    assert torch_bn == keras_bn and len(torch_bn) == 20
    assert leaf_modules(torch_model) <= {r["layer"] for r in torch_rows}
    assert {kn.audit_name(n) for n in keras_names(keras_model)} | {"loss"} <= {r["layer"] for r in keras_rows}
    # torch: BatchNorm takes the float16 activation as is (no cast, float32 weight) and returns
    # float16, saving float32 batch statistics; the same mixed op runs backward.
    assert dtype_of(torch_rows, "native_batch_norm") == dict.fromkeys(torch_bn, "float16+float32")
    assert dtype_of(torch_rows, "native_batch_norm_backward", "backward") == dict.fromkeys(torch_bn, "float16+float32")
    assert not {r["layer"] for r in torch_rows if r["op"] == "_to_copy" and r["phase"] == "forward"} & torch_bn
    # Keras: BatchNormalization casts its input to float32, computes moments and the
    # normalisation in float32, and casts the result back to float16, both ways.
    for name in keras_bn:
        assert layer_dtypes(keras_rows, name) == layer_dtypes(keras_rows, name, "backward") == {"float32", "float16"}
        ops = {r["op"]: r["compute_dtype"] for r in keras_rows if r["layer"] == name and r["op"] != "Cast"}
        assert set(ops.values()) == {"float32"} and {"Mean", "Rsqrt"} <= set(ops)
    # The global average pool: a float16 mean in torch, a float32 one in Keras.
    assert dtype_of(torch_rows, "mean") == {"avgpool": "float16"}
    assert dtype_of(keras_rows, "Mean")["avgpool"] == "float32"
    # The classifier: float16 under autocast, float32 by keras_impl/models.py's override.
    assert dtype_of(torch_rows, "addmm") == {"fc": "float16"}
    assert dtype_of(keras_rows, "MatMul") == {"fc": "float32"}
    # Both sum a residual's two gradient branches outside any layer, in float16.
    assert dtype_of(torch_rows, "add", "backward")[""] == dtype_of(keras_rows, "AddN", "backward")[""] == "float16"
    # A diagnosis leaves the models as they were (BatchNorm statistics included).
    assert all(torch.equal(before[k], v) for k, v in torch_model.state_dict().items())
    assert all(np.array_equal(a, v.numpy()) for a, v in zip(keras_before, keras_model.non_trainable_variables))


def test_audit_rejects_unknown_precision_and_a_model_built_under_another_policy():
    x, y = batch("simple_cnn")
    with pytest.raises(ValueError, match="valid: fp32, fp16, bf16"):
        tn.dtype_audit(build_torch("simple_cnn"), *torch_batch(x, y), "fp4")
    with pytest.raises(ValueError, match="'float32' policy, not 'mixed_float16'"):
        kn.dtype_audit(build_keras("simple_cnn", "fp32"), x, y, "fp16")


# ---------------------------------------------------------------------------------------------
# float32 overrides
# ---------------------------------------------------------------------------------------------

def test_torch_fp32_override_takes_effect():
    x, y = torch_batch(*batch("simple_cnn"))
    model = build_torch("simple_cnn")
    assert tn.apply_fp32_layers(model, ["conv1", "fc"]) is model
    rows = tn.dtype_audit(model, x, y, "fp16")
    assert dtype_of(rows, "convolution") == {"conv1": "float32", "conv2": "float16"}
    assert dtype_of(rows, "convolution_backward", "backward") == {"conv1": "float32", "conv2": "float16"}
    assert dtype_of(rows, "addmm") == {"fc": "float32"}
    assert dtype_of(rows, "_to_copy")["fc"] == "float32"  # its float16 input, cast up
    with pytest.raises(ValueError, match=r"unknown layer name\(s\) 'conv3' \(valid: conv1, conv2, fc, flatten, pool1, "
                                         r"pool2, relu1, relu2\)"):
        tn.apply_fp32_layers(model, ["conv3"])

    resnet = tn.apply_fp32_layers(build_torch("resnet18"), ["layer4"])  # a block and everything in it
    convs = dtype_of(tn.dtype_audit(resnet, *torch_batch(*batch("resnet18")), "fp16"), "convolution")
    assert {n for n, d in convs.items() if d == "float32"} == {n for n in convs if n.startswith("layer4.")}
    assert {d for n, d in convs.items() if not n.startswith("layer4.")} == {"float16"}


def test_keras_fp32_override_takes_effect():
    x, y = batch("simple_cnn")
    model = build_keras("simple_cnn", "fp16")
    forced = kn.apply_fp32_layers(model, ["conv1"])
    assert keras.config.dtype_policy().name == "float32"  # the global policy is back
    assert type(forced) is AmpModel and forced is not model
    assert forced.dtype_policy.name == "mixed_float16"
    assert model.get_layer("conv1").dtype_policy.name == "mixed_float16"  # the original is untouched
    assert {k: v.tolist() for k, v in km.get_weights(forced).items()} == \
           {k: v.tolist() for k, v in km.get_weights(model).items()}
    rows = kn.dtype_audit(forced, x, y, "fp16")
    assert dtype_of(rows, "Conv2D") == {"conv1": "float32", "conv2": "float16"}
    assert dtype_of(rows, "Conv2DBackpropFilter", "backward") == {"conv1": "float32", "conv2": "float16"}
    with pytest.raises(ValueError, match=r"unknown layer name\(s\) 'conv3' \(valid: conv1, conv2, fc, flatten"):
        kn.apply_fp32_layers(model, ["conv3"])

    resnet = kn.apply_fp32_layers(build_keras("resnet18", "fp16"), ["layer4"])
    convs = dtype_of(kn.dtype_audit(resnet, *batch("resnet18"), "fp16"), "Conv2D")
    assert {n for n, d in convs.items() if d == "float32"} == {n for n in convs if n.startswith("layer4.")}
    assert {d for n, d in convs.items() if not n.startswith("layer4.")} == {"float16"}


# ---------------------------------------------------------------------------------------------
# gradient underflow
# ---------------------------------------------------------------------------------------------

FRACTIONS = ("zero_fraction", "flush_fraction_unscaled", "subnormal_fraction_unscaled", "flush_fraction_scaled",
             "subnormal_fraction_scaled", "overflow_fraction_scaled")


def underflow_both(name: str, precision: str, loss_scale: float, loss_weight: float = 1.0):
    x, y = batch(name)
    torch_model, keras_model = build_pair(name, precision)
    return (tn.gradient_underflow(torch_model, *torch_batch(x, y), precision, loss_scale, loss_weight),
            kn.gradient_underflow(keras_model, x, y, precision, loss_scale, loss_weight))


def test_gradient_stats_round_like_float16():
    g = np.array([0, 2**-26, 2**-25, 1.5 * 2**-25, 2**-24, 2**-15, 2**-14, 1.0, 40000.0, 2.0**-50], np.float32)
    row = tn.gradient_stats("fc", "weight", g, 2.0)
    # Round to nearest even: 2**-26, 2**-50 and the tie 2**-25 become 0, 1.5 * 2**-25 becomes 2**-24.
    assert row["nonzero"] == 9 and row["zero_fraction"] == pytest.approx(0.1)
    assert row["flush_fraction_unscaled"] == pytest.approx(3 / 9)  # 2**-26, 2**-25, 2**-50
    assert row["subnormal_fraction_unscaled"] == pytest.approx(6 / 9)  # and 1.5 * 2**-25, 2**-24, 2**-15
    assert row["flush_fraction_scaled"] == pytest.approx(2 / 9)  # 2**-25 * 2 is 2**-24: kept
    assert row["overflow_fraction_scaled"] == pytest.approx(1 / 9)  # 80000 > 65504
    hist = row["log2_hist"]
    assert list(hist) == list(range(-40, 17)) and sum(hist.values()) == 9
    assert hist[-40] == 1 and hist[0] == 1 and hist[15] == 1 and hist[-25] == 2  # 2**-50 clamps to -40
    assert kn.gradient_stats("fc", "weight", g, 2.0) == row


@pytest.mark.parametrize("name", MODELS)
def test_underflow_fractions_are_consistent(name):
    for scale in (2.0**15, 1.0):
        for rows in underflow_both(name, "fp16", scale):
            for r in rows:
                assert all(0 <= r[k] <= 1 for k in FRACTIONS), r
                assert r["flush_fraction_scaled"] <= r["flush_fraction_unscaled"]
                assert r["subnormal_fraction_scaled"] <= r["subnormal_fraction_unscaled"]
                if scale == 1:
                    assert r["flush_fraction_scaled"] == r["flush_fraction_unscaled"]
                    assert r["subnormal_fraction_scaled"] == r["subnormal_fraction_unscaled"]
                assert sum(r["log2_hist"].values()) == r["nonzero"]
            summary = underflow_summary(rows)
            assert summary["flush_fraction_scaled"] <= summary["flush_fraction_unscaled"]


def test_same_weights_give_the_same_rows_in_fp32():
    torch_rows, keras_rows = underflow_both("simple_cnn", "fp32", 2.0**15)
    by_key = {(r["layer"], r["param"]): r for r in keras_rows}
    assert set(by_key) == {(r["layer"], r["param"]) for r in torch_rows}
    for r in torch_rows:
        other = by_key[(r["layer"], r["param"])]
        assert r["elements"] == other["elements"]
        for key in FRACTIONS:
            assert r[key] == pytest.approx(other[key], abs=0.01), (r["layer"], r["param"], key)


def test_loss_scaling_rescues_tiny_gradients():
    """Gradients 1e-9 times the usual: nearly all flush to zero in float16, almost none once scaled by 2**24.

    fp32 forward and backward, so the float32 gradients are exact and only the float16 rounding is measured.
    """
    for rows in underflow_both("simple_cnn", "fp32", 2.0**24, loss_weight=1e-9):
        summary = underflow_summary(rows)
        assert summary["flush_fraction_unscaled"] > 0.9
        assert summary["flush_fraction_scaled"] < 0.05
        assert summary["overflow_fraction_scaled"] == 0


def test_unscaled_fp16_backward_loses_tiny_gradients_before_float32():
    """Under fp16 the backward of the float16 layers itself underflows: those gradients come out exactly zero.

    torch's classifier is float16 under autocast, so every gradient is lost; Keras' is float32
    (keras_impl/models.py), so only its own gradients survive. The float32 reference has none of these zeros.
    """
    torch_rows, keras_rows = underflow_both("simple_cnn", "fp16", 1.0, loss_weight=1e-9)
    assert {r["layer"]: r["zero_fraction_mixed"] for r in torch_rows} == {"conv1": 1, "conv2": 1, "fc": 1}
    zero = {r["layer"]: r["zero_fraction_mixed"] for r in keras_rows}
    assert zero["conv1"] == zero["conv2"] == 1 and zero["fc"] < 0.5
    for rows in (torch_rows, keras_rows):
        assert all(r["zero_fraction"] < 0.5 for r in rows)  # the reference: float32 forward and backward


SAME_METHOD_KEYS = ("zero_fraction", "flush_fraction_unscaled", "subnormal_fraction_unscaled",
                    "flush_fraction_scaled", "subnormal_fraction_scaled", "overflow_fraction_scaled")


def test_underflow_is_measured_the_same_way_in_both_frameworks():
    """Requirement 9: both sides round a float32 reference gradient and read the real mixed backward's zeros.

    Same weights, same batch, gradients 1e-4 times the usual, fp16 at scale 2**10: the reference
    numbers agree element-weighted to 0.5 points and are far from zero (a side that took its
    "would flush" from the float16 backward instead reads ~0, its zeros being excluded), and both
    mixed backwards lose a comparable share of the reference's elements.
    """
    from amp_compare.kit.fp16 import UNDERFLOW_METHOD

    torch_rows, keras_rows = underflow_both("simple_cnn", "fp16", 2.0**10, loss_weight=1e-4)
    assert {r["method"] for r in torch_rows + keras_rows} == {UNDERFLOW_METHOD}
    t, k = underflow_summary(torch_rows), underflow_summary(keras_rows)
    assert t["flush_fraction_unscaled"] > 0.05 and t["subnormal_fraction_scaled"] > 0.05
    for key in SAME_METHOD_KEYS:
        assert t[key] == pytest.approx(k[key], abs=0.005), key
    for s in (t, k):
        assert s["lost_fraction_mixed_unscaled"] > 0.05  # the float16 backward really loses them
        assert s["lost_fraction_mixed_scaled"] < 0.01  # the scale rescues them
        assert s["zero_fraction_mixed"] > s["zero_fraction"] + 0.05
    assert t["lost_fraction_mixed_unscaled"] == pytest.approx(k["lost_fraction_mixed_unscaled"], abs=0.03)


# ---------------------------------------------------------------------------------------------
# NaN / Inf locator
# ---------------------------------------------------------------------------------------------

def overflowing_conv1(precision: str):
    """conv1 weights all 1 and inputs ~1e4: each 3x3 sum is ~8e4, beyond float16's 65504."""
    torch_model = build_torch("simple_cnn")
    weights = pm.get_weights(torch_model)
    weights["conv1.weight"][:] = 1.0
    pm.set_weights(torch_model, weights)
    x, y = batch("simple_cnn")
    return torch_model, build_keras("simple_cnn", precision, weights), (0.8 + 0.2 * x) * 1e4, y


def test_locate_forward_overflow_at_the_same_layer_in_both():
    torch_model, keras_model, x, y = overflowing_conv1("fp16")
    expected = {"where": "forward", "layer": "conv1", "tensor": "output", "value": "inf"}
    assert tn.locate_nonfinite(torch_model, *torch_batch(x, y), "fp16", 2.0**15) == expected
    assert kn.locate_nonfinite(keras_model, x, y, "fp16", 2.0**15) == expected
    for precision in ("fp32", "bf16"):  # float32's exponent range: the same sums are finite
        torch_model, keras_model, x, y = overflowing_conv1(precision)
        assert tn.locate_nonfinite(torch_model, *torch_batch(x, y), precision, 2.0**15) is None
        assert kn.locate_nonfinite(keras_model, x, y, precision, 2.0**15) is None


def test_locate_backward_overflow_from_a_huge_loss_scale():
    x, y = batch("simple_cnn")
    torch_model, keras_model = build_pair("simple_cnn", "fp16")
    xt, yt = torch_batch(x, y)
    assert tn.locate_nonfinite(torch_model, xt, yt, "fp16", 2.0**15) is None
    assert kn.locate_nonfinite(keras_model, x, y, "fp16", 2.0**15) is None
    # loss * 2**40 stays finite in float32; the first float16 gradient from the loss does not.
    # That is the gradient of torch's float16 logits (fc's output), but of Keras' flatten output
    # (the float32 fc computes its gradients in float32 and casts only its input gradient down).
    assert tn.locate_nonfinite(torch_model, xt, yt, "fp16", 2.0**40) == \
           {"where": "backward", "layer": "fc", "tensor": "output", "value": "inf"}
    flatten = kn.canonical_name(next(la for la in keras_model.layers if isinstance(la, keras.layers.Flatten)))
    assert kn.locate_nonfinite(keras_model, x, y, "fp16", 2.0**40) == \
           {"where": "backward", "layer": flatten, "tensor": "output", "value": "inf"}
    # fp16-static: the run's fixed scale is used as it is (seen: Keras fp16-static at 2**40 recorded "ok").
    assert tn.locate_nonfinite(torch_model, xt, yt, "fp16-static", 2.0**40) == \
           {"where": "backward", "layer": "fc", "tensor": "output", "value": "inf"}
    assert kn.locate_nonfinite(keras_model, x, y, "fp16-static", 2.0**40) == \
           {"where": "backward", "layer": flatten, "tensor": "output", "value": "inf"}
    # bf16 is not loss-scaled: a run passes its scale, 1.0 (current_scale of a disabled scaler).
    torch_model, keras_model = build_pair("simple_cnn", "bf16")
    assert tn.locate_nonfinite(torch_model, xt, yt, "bf16", 1.0) is None
    assert kn.locate_nonfinite(keras_model, x, y, "bf16", 1.0) is None


def test_both_frameworks_share_the_numpy_helpers():
    from amp_compare.kit import fp16

    assert tn.gradient_stats is kn.gradient_stats is fp16.gradient_stats
    assert tn.nonfinite_kind is kn.nonfinite_kind is fp16.nonfinite_kind


# ---------------------------------------------------------------------------------------------
# aligned mode: dtype-identical mixed models
# ---------------------------------------------------------------------------------------------

def _audit_both(cfg, input_shape, x, y, precision):
    """Both frameworks' dtype audits of the models an aligned compare builds (make_model, cfg(framework)): the
    (layer, phase) keys each listed, their rows as the records hold them, and the side-by-side table the report
    shows."""
    import pandas as pd

    from amp_compare.harness.report.numerics import dtype_side_by_side
    from amp_compare.keras_impl import train as kt
    from amp_compare.torch_impl import train as pt

    data = type("Data", (), {"input_shape": input_shape, "num_classes": CLASSES})()
    torch_rows = tn.dtype_audit(pt.make_model(cfg("torch"), data), *torch_batch(x, y), precision)
    mixed_precision(precision)
    keras_rows = kn.dtype_audit(kt.make_model(cfg("tf"), data), x, y, precision)
    rows = pd.DataFrame([{**r, "framework": "torch", "seed": 0, "precision": precision} for r in torch_rows]
                        + [{**r, "framework": "tf", "seed": 0, "precision": precision} for r in keras_rows])
    keys = {fw: {(r["layer"], r["phase"]) for r in fw_rows} for fw, fw_rows in (("torch", torch_rows),
                                                                                ("tf", keras_rows))}
    return keys, rows, dtype_side_by_side(rows)[precision]


FIRST_OP = {"mlp": "addmm"}  # the op of each model's first layer that autocast runs in the half dtype


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
@pytest.mark.parametrize("name", MODELS)
def test_aligned_dtype_audits_agree_layer_by_layer(name, precision):
    """Built as an aligned compare builds them (make_model), both audits list the same (layer, phase)
    rows and every row computes in the same dtypes: the classifier and the loss included."""
    from amp_compare.contract.config import RunConfig

    def cfg(framework):
        return RunConfig(framework=framework, model=name, dataset="synthetic", width=WIDTH, precision=precision,
                         comparison="aligned")

    x, y = batch(name)
    keys, rows, table = _audit_both(cfg, SHAPES[name], x, y, precision)
    assert keys["torch"] == keys["tf"], (keys["torch"] ^ keys["tf"])
    assert not table["differs"].any(), table[table["differs"]].to_string()
    fc = table[(table["layer"] == "fc") & (table["phase"] == "forward")]
    assert fc.iloc[0]["PyTorch dtypes"] == fc.iloc[0]["Keras (TF) dtypes"] == HALF[precision]
    loss = table[(table["layer"] == "loss") & (table["phase"] == "forward")]
    assert loss.iloc[0]["PyTorch dtypes"] == loss.iloc[0]["Keras (TF) dtypes"] == "float32"
    # The Numerics section's dtype audit reads these rows (harness/report/numerics.op_dtype_facts).
    from amp_compare.harness.report.numerics import op_dtype_facts

    facts = op_dtype_facts(rows, "cpu")
    assert facts["device"] == "CPU" and facts["differing"][precision]["rows"] == 0
    torch_ops = rows[(rows["framework"] == "torch") & (rows["phase"] == "forward") & (rows["op"] != "_to_copy")]
    ran = torch_ops.groupby("op")["compute_dtype"].agg(lambda s: {x for v in s for x in v.split("+")})
    assert ran["_log_softmax"] == ran["nll_loss_forward"] == {"float32"}
    assert "float32" not in ran[FIRST_OP.get(name, "convolution")]
    # CPU autocast: softmax-free, but BatchNorm's normalised output stays half (not on a float32 list)
    assert ran.get("native_batch_norm") != {"float32"}



def test_nonfinite_weights_behind_a_finite_loss_mark_the_run_diverged():
    """Seen: Keras fp16-static at 2**40, every conv weight NaN after step 0, loss finite, recorded "ok"."""
    from amp_compare.kit.child import TrainResult, check_final_weights

    result = TrainResult(step_loss=[2.3, 2.3, 2.3])
    check_final_weights(result, {"conv1.weight": np.ones(3), "conv2.weight": np.array([1.0, np.nan])})
    assert result.diverged_at_step == 2 and "conv2.weight" in result.diverged_reason
    assert result.nonfinite == {"step": 2, "where": "parameters", "layer": "conv2.weight", "value": "nan/inf",
                                "tensor": "conv2.weight"}
    finite = TrainResult(step_loss=[2.3])
    check_final_weights(finite, {"conv1.weight": np.ones(3)})
    assert finite.diverged_at_step is None and finite.nonfinite is None


def test_report_shows_both_underflow_methods_for_both_frameworks():
    """The report's underflow table and sentences carry both methods' numbers, each as measured, per framework."""
    import pandas as pd

    from amp_compare.harness.report import numerics as nr
    from amp_compare.harness.report.render import _underflow_table

    torch_rows, keras_rows = underflow_both("simple_cnn", "fp16", 2.0**10, loss_weight=1e-4)
    frame = pd.DataFrame([{**r, "framework": fw, "precision": "fp16", "seed": 0, "when": "last step"}
                          for fw, rows in (("torch", torch_rows), ("tf", keras_rows)) for r in rows])
    summary = nr.underflow_summary(frame).set_index("framework")
    for fw, rows in (("torch", torch_rows), ("tf", keras_rows)):
        direct = underflow_summary(rows)
        assert summary.loc[fw, "flush_unscaled"] == pytest.approx(direct["flush_fraction_unscaled"])
        assert summary.loc[fw, "lost_unscaled"] == pytest.approx(direct["lost_fraction_mixed_unscaled"])
        assert summary.loc[fw, "lost_scaled"] == pytest.approx(direct["lost_fraction_mixed_scaled"])
        assert summary.loc[fw, "zero_fraction_mixed"] == pytest.approx(direct["zero_fraction_mixed"])
    table = _underflow_table(frame)
    assert {"float32 reference: would flush in fp16, no scaling", "mixed backward: lost, no scaling"} <= set(table)
    lost = table.set_index("Framework")["mixed backward: lost, no scaling"]
    assert lost["PyTorch"] == f"{summary.loc['torch', 'lost_unscaled']:.3%}"
    # Records from before the mixed-backward columns: "n/a", not a number the run never measured.
    old = frame.drop(columns=["zero_fraction_mixed", "lost_fraction_mixed_unscaled", "lost_fraction_mixed_scaled"])
    assert set(_underflow_table(old)["mixed backward: lost, no scaling"]) == {"n/a"}


# ---------------------------------------------------------------------------------------------
# defaults mode: the two Adam formulas, measured on the run's own gradients
# ---------------------------------------------------------------------------------------------

def test_adam_default_epsilons_are_the_installed_frameworks():
    from amp_compare.kit.adam_gap import ADAM_DEFAULT_EPSILON

    assert ADAM_DEFAULT_EPSILON["torch"] == torch.optim.Adam([torch.nn.Parameter(torch.zeros(1))]).defaults["eps"]
    assert ADAM_DEFAULT_EPSILON["tf"] == pytest.approx(keras.optimizers.Adam().epsilon, rel=1e-12)


def test_adam_first_step_gap_is_what_the_real_optimizers_do():
    """The shared formulas against one real step of torch.optim.Adam and keras.optimizers.Adam, default eps each."""
    from amp_compare.kit.adam_gap import ADAM_DEFAULT_EPSILON, adam_first_step_gap

    rng = np.random.default_rng(0)
    g = (rng.standard_normal(4000) * 10.0 ** rng.uniform(-10, 0, 4000)).astype(np.float32)
    lr = 1e-3
    p = torch.nn.Parameter(torch.zeros(g.size))
    opt = torch.optim.Adam([p], lr=lr)
    p.grad = torch.from_numpy(g.copy())
    opt.step()
    torch_update = -p.detach().numpy().astype(np.float64)
    v = keras.Variable(np.zeros(g.size, np.float32))
    keras.optimizers.Adam(learning_rate=lr).apply([g], [v])
    keras_update = -keras.ops.convert_to_numpy(v).astype(np.float64)
    real = np.abs(torch_update - keras_update) / np.abs(torch_update)
    gap = adam_first_step_gap([g], lr, 0.9, 0.999, ADAM_DEFAULT_EPSILON["torch"], ADAM_DEFAULT_EPSILON["tf"])
    assert gap["adam_gap_elements"] == g.size
    assert gap["adam_gap_max"] == pytest.approx(real.max(), rel=1e-3) and gap["adam_gap_max"] > 0.5
    assert gap["adam_gap_median"] == pytest.approx(np.median(real), rel=1e-2, abs=1e-5)
    assert gap["adam_gap_over_1pct"] == pytest.approx((real > 0.01).mean(), abs=0.002)
    same = adam_first_step_gap([g], lr, 0.9, 0.999, 1e-8, 1e-8 * np.sqrt(1 - 0.999))  # Keras' eps-hat = torch's eps
    assert same["adam_gap_max"] < 1e-9


def test_defaults_mode_adam_gap_from_both_children_and_in_the_differences_table():
    """adam_formula_gap of both frameworks (the functions the children call in defaults mode) on the same
    weights and batch, then the sentence the report's differences table shows, numbers from the records."""
    import pandas as pd

    from amp_compare.harness.report.render import framework_differences

    x, y = batch("simple_cnn")
    torch_model, keras_model = build_pair("simple_cnn", "fp32")
    torch_gap = tn.adam_formula_gap(torch_model, *torch_batch(x, y), "fp32",
                                    torch.optim.Adam(torch_model.parameters(), lr=1e-3))
    keras_gap = kn.adam_formula_gap(keras_model, x, y, "fp32", keras.optimizers.Adam(learning_rate=1e-3))
    for key in ("adam_gap_elements", "adam_gap_median", "adam_gap_over_1pct"):
        assert torch_gap[key] == pytest.approx(keras_gap[key], rel=0.05, abs=1e-6), key
    assert torch_gap["adam_gap_median"] > 0 and torch_gap["adam_gap_elements"] > 1000
    runs = pd.DataFrame([{"framework": fw, "status": "ok", **gap} for fw, gap in (("torch", torch_gap),
                                                                                   ("tf", keras_gap))])
    row = next(d for d in framework_differences(runs) if d["item"] == "Adam update formula")
    assert f"median {torch_gap['adam_gap_median']:.3g}" in row["measured"]
    assert f"median {keras_gap['adam_gap_median']:.3g}" in row["measured"]
    assert all(d["measured"] == "" for d in framework_differences(runs.drop(columns=list(torch_gap))))


# The rows the two aligned vit audits cannot make equal (contract/mapping.py "attention_core"): torch's fused
# attention backward runs in the half dtype alone, Keras' attention gradient mixes float32 (its softmax) and
# half; and Keras sums the gradients of the one cast feeding the query/key/value projections in the half dtype,
# where torch's engine sums the three float32 gradients of each Linear's own cast (the "" row).
VIT_AUDIT_DIFFERENCES = {("", "backward"), ("blocks.0.attn", "backward")}


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_aligned_vit_audits_agree_but_for_the_attention_gradients(precision):
    """The vit built as an aligned compare builds it: every (layer, phase) row in both audits, the same dtypes
    everywhere but the rows VIT_AUDIT_DIFFERENCES names; the computed-dtype table (harness/report/numerics.py)
    shows LayerNorm, the token stream and the class-token/position add computing in float32 and the matmuls in
    the half dtype in both, and each framework's own softmax."""
    from amp_compare.contract.config import RunConfig
    from amp_compare.harness.report.numerics import vit_dtype_table

    def cfg(framework):
        return RunConfig(framework=framework, model="vit", dataset="digits", precision=precision, vit_dim=16,
                         vit_depth=1, comparison="aligned")

    rng = np.random.default_rng(0)
    x, y = rng.random((BATCH, 16, 16, 1), dtype=np.float32), rng.integers(0, CLASSES, BATCH)
    keys, rows, table = _audit_both(cfg, (16, 16, 1), x, y, precision)
    assert keys["torch"] == keys["tf"], keys["torch"] ^ keys["tf"]
    assert set(zip(table.loc[table["differs"], "layer"], table.loc[table["differs"], "phase"])) == \
           VIT_AUDIT_DIFFERENCES, table[table["differs"]].to_string()
    parts = vit_dtype_table(rows)[precision].set_index("part")
    half = HALF[precision]
    for component, dtype in (("LayerNorm", "float32"), ("residual adds", "float32"),
                             ("class token + position embedding", "float32"), ("GELU", half), ("head (fc)", half),
                             ("attention: Q/K/V/output projections", half), ("Q·Kᵀ", half), ("·V", half)):
        assert parts.loc[component, "PyTorch computed in"] == parts.loc[component, "Keras (TF) computed in"] == dtype
    # the dtype each side's softmax computed in, from its inputs: torch's fused kernel reads the half dtype (its
    # float32 log-sum-exp output is no float32 softmax), Keras' Softmax reads float32
    softmax = parts.loc["softmax (with the logits' scale)"]
    assert softmax["PyTorch computed in"] == half and softmax["Keras (TF) computed in"] == "float32"
    assert softmax["PyTorch"].startswith(f"fused kernel _scaled_dot_product_flash_attention_for_cpu, inputs {half}")
    assert parts.loc["Q·Kᵀ", "PyTorch"] == f"the fused kernel, inputs {half}"
    assert "Softmax: float32" in softmax["Keras (TF)"] and parts.loc["Q·Kᵀ", "Keras (TF)"] == f"Einsum: {half}"
    assert list(parts.index[parts["differs"]]) == ["softmax (with the logits' scale)"]
