"""--profile: oneDNN's log read right, torch's profiled window through the function a compare calls, and the
report's Profile section from tables of each kind (evidence, none)."""

import math
import os

import pandas as pd

from amp_compare.contract import env
from amp_compare.harness.report import speed
from amp_compare.kit import profile as kit

# Lines as oneDNN 3.x writes them (TensorFlow 2.21's creation log; torch 2.13's execution log).
LINES = [
    "onednn_verbose,v1,info,cpu,isa:Intel AVX-512 with Intel DL Boost and bfloat16 support",
    "onednn_verbose,v1,primitive,create:cache_miss,cpu,convolution,jit:avx512_core,backward_weights,src:f32::blocked:"
    "acdb::f0 wei:f32:ap:blocked:Acdb16a::f0 bia:f32::blocked:a::f0 dst:f32::blocked:acdb::f0,,alg:convolution_direct,"
    "mb64_ic3oc8_ih16oh14kh3sh1dh0ph0_iw16ow14kw3sw1dw0pw0,0.113037",
    "onednn_verbose,v1,primitive,exec,cpu,convolution,ref:any,backward_weights,src:f16::blocked:acdb::f0 "
    "wei:f16::blocked:Acdb16a::f0 dst:f16::blocked:acdb::f0,,alg:convolution_direct,mb64_ic3oc8,6712.5",
    "onednn_verbose,v1,primitive,exec,cpu,reorder,jit:uni,undef,src:f32::blocked:abcd::f0 dst:bf16::blocked:abcd::f0,"
    ",,8x3x3x3,0.5",
]


def test_onednn_log_names_the_implementation_dtype_and_time():
    rows = {(r["kind"], r["impl"]): r for r in kit.parse_onednn(LINES)}
    ref = rows[("convolution", "ref:any")]
    assert ref["dtype"] == "f16" and ref["executions"] == 1 and math.isclose(ref["exec_time_s"], 6.7125)
    assert ref["path"].startswith("oneDNN reference") and "not JIT" in ref["path"]
    jit = rows[("convolution", "jit:avx512_core")]
    assert jit["created"] == 1 and jit["executions"] == 0 and jit["path"] == "oneDNN JIT (jit:avx512_core)"
    assert rows[("reorder", "jit:uni")]["dtype"] == "f32->bf16"
    assert kit.parse_onednn(LINES)[0]["impl"] == "ref:any"  # the slowest first


def test_library_path_and_casts_of_torch_ops():
    prims = kit.parse_onednn(LINES)
    # a half convolution's backward: oneDNN's reference kernel ran it here; with no backward primitive: ATen native
    assert "ref:any" in kit.torch_library("aten::convolution_backward", "c10::Half,c10::Half", prims)
    assert kit.torch_library("aten::convolution_backward", "c10::BFloat16", prims).startswith("ATen native")
    assert kit.is_cast("aten::copy_", "c10::BFloat16,float") and not kit.is_cast("aten::copy_", "float,float")
    assert kit.tf_library("_MklNativeFusedConv2D", False).startswith("oneDNN")
    assert "refused float16" in kit.tf_library("Conv2DBackpropFilter", True)
    ops, cast_share = kit.op_evidence([
        {"op": "aten::copy_", "calls": 2, "self_time_s": 1.0, "dtypes": "c10::BFloat16,float", "library": ""},
        {"op": "aten::copy_", "calls": 2, "self_time_s": 1.0, "dtypes": "float,float", "library": ""},
        {"op": "aten::mm", "calls": 1, "self_time_s": 2.0, "dtypes": "c10::BFloat16,c10::BFloat16", "library": "x"}])
    assert cast_share == 0.25 and [o["op"] for o in ops][0] == "aten::mm"
    assert {o["op"] for o in ops if o["cast"]} == {"aten::copy_ (dtype change)"}


def test_each_window_warms_up_then_measures_the_same_batches():
    """kit/profile.windows: plain then profiled, each WARM_STEPS warm-up positions then its measured ones, from
    the plan's first batch, cycled through a short plan."""
    (first, plain), (second, profiled) = kit.windows(100)
    assert (first, second) == ("plain", "profiled")
    assert plain == list(range(kit.WARM_STEPS + kit.PLAIN_STEPS))
    assert profiled == list(range(kit.WARM_STEPS + kit.WINDOW_STEPS))
    assert kit.windows(3)[1][1] == [i % 3 for i in range(kit.WARM_STEPS + kit.WINDOW_STEPS)]


def test_torch_window_writes_a_trace_and_tables_outside_the_timed_steps(tmp_path, monkeypatch):
    """torch_impl/profile.py's window, as train() calls it, on a tiny bf16 simple_cnn."""
    import torch

    from amp_compare.contract.config import RunConfig
    from amp_compare.kit.child import TrainResult
    from amp_compare.kit.data import epoch_batches, load_dataset
    from amp_compare.torch_impl import profile, train

    monkeypatch.setenv(kit.PROFILE_ENV, str(tmp_path / "profile"))
    cfg = RunConfig(dataset="synthetic", precision="bf16", batch_size=16, threads=1, profile=True)
    data = load_dataset("synthetic")
    train.setup(cfg)
    run = train.compile_model(cfg, train.make_model(cfg, data), torch.device("cpu"))
    result, labels, step = TrainResult(), [], profile.train_step
    monkeypatch.setattr(profile, "train_step", lambda net, opt, scaler, x, y, *a: labels.append(y.tolist()) or
                        step(net, opt, scaler, x, y, *a))
    tensors = train.make_dataset(cfg, data)
    profile.profile_window(cfg, run, tensors, result, profile.start_logs(cfg))
    plan = epoch_batches(len(data.x_train), cfg.batch_size, cfg.seed, 0)
    assert labels == [data.y_train[plan[i]].tolist() for _, at in kit.windows(len(plan)) for i in at]  # kit's order
    assert (tmp_path / "profile" / "trace.json").stat().st_size > 0
    assert result.step_time_s == [] and result.info["profile_steps"] == kit.WINDOW_STEPS  # no timed step added
    assert result.info["profile_overhead"] > 0 and 0 <= result.info["profile_cast_share"] < 1
    ops = pd.DataFrame(result.profile_ops)
    forward = ops[ops["op"].str.contains("conv") & ~ops["op"].str.contains("backward")]
    conv = forward.iloc[0]  # the slowest forward convolution op
    assert "BFloat16" in conv["dtypes"]
    ran = [p for p in result.profile_primitives if p["kind"] == "convolution" and p["executions"]]
    # Which kernel runs a bf16 convolution is the CPU's business: oneDNN's where the CPU has bfloat16 arithmetic
    # (torch's mkldnn_convolution), ATen's own elsewhere (AVX2 only: _slow_conv2d_forward, no oneDNN primitive).
    # What holds on every CPU: the library named is the one oneDNN's log shows ran.
    cpu = env.cpu_info()
    if cpu["cpu_bf16_hardware"] and not any(os.environ.get(v) for v in env.ISA_LIMIT_VARS):
        assert "mkldnn" in conv["op"]  # aten::mkldnn_convolution
    if "mkldnn" in conv["op"]:
        assert conv["library"].startswith("oneDNN") and ran
    else:
        assert conv["library"].startswith("ATen native") and not ran


def _tables(profiled: bool) -> dict:
    ids = ["tf-simple_cnn-digits-fp32-s0", "tf-simple_cnn-digits-fp16-s0", "tf-simple_cnn-digits-bf16-s0"]
    runs = pd.DataFrame({"cell_id": ids, "precision": ["fp32", "fp16", "bf16"], "status": "ok",
                         "median_step_s": [0.01, 0.1, 0.0101], "profile_steps": 5, "profile_overhead": 1.2,
                         "profile_step_s": 0.02, "profile_cast_share": [0.0, 0.01, 0.0],
                         "profile_trace": "profile/x.xplane.pb"})
    ops = pd.DataFrame([
        {"cell_id": ids[0], "op": "_MklNativeConv2DBackpropFilterWithBias", "self_time_s": 0.02, "library": "oneDNN"},
        {"cell_id": ids[1], "op": "Conv2DBackpropFilter", "self_time_s": 0.4, "library": "TF native (Eigen)"},
        {"cell_id": ids[1], "op": "Cast", "self_time_s": 0.01, "library": "TF native (Eigen)"}])
    prims = pd.DataFrame([{"cell_id": ids[1], "kind": "inner_product", "prop_kind": "forward_training",
                           "impl": "ref:any", "dtype": "f16"}])
    return {"run": runs, **({"profile_ops": ops, "profile_primitives": prims} if profiled else {})}


def test_report_names_the_ops_and_library_behind_a_slow_cell():
    section = speed.profile_section(_tables(True))
    rows = section["table"].set_index("cell")
    assert list(rows.index) == ["tf-simple_cnn-digits-fp16-s0"]  # bf16 is within 10% of fp32: not explained
    assert section["band"] == "10%"  # the page's paragraph names the band the rows were chosen by
    row = rows.iloc[0]
    assert row["vs fp32"] == "0.10x (slower)"
    assert row["operations behind the difference"].startswith("Conv2DBackpropFilter +80.0 ms/step")
    assert "Conv2DBackpropFilter: TF native (Eigen)" in row["library path"]
    assert "reference kernel ref:any for inner_product forward_training (f16)" in row["library path"]
    assert "1.20x a bare one" in section["sentences"][0]


def test_report_says_unexplained_without_evidence():
    row = speed.profile_section(_tables(False))["table"].iloc[0]
    assert row["operations behind the difference"].startswith("unexplained")
