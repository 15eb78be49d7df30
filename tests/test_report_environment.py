"""The Environment section and the initial-weights row say what a reader can take at face value."""

import json

import pandas as pd

from amp_compare.harness.report.render import environment_rows, framework_differences


def _runs(device="cpu"):
    rows = []
    for fw in ("torch", "tf"):
        for prec, api in (("fp32", "none"), ("fp16", f"{fw} fp16 api"), ("bf16", f"{fw} bf16 api")):
            rows.append({"framework": fw, "precision": prec, "status": "ok", "device_name": device,
                         "torch_threads": 2.0 if fw == "torch" else None,
                         "tf_intra_op_threads": 2.0 if fw == "tf" else None,
                         "tf_cuda_version": "12.5.1" if fw == "tf" else None,
                         "tf_cudnn_version": 9.0 if fw == "tf" else None, "amp_api": api,
                         "init_source": "shared file m-s0.npz, made by torch default initialisers, seed 0"
                         + (" (this cell)" if (fw, prec) == ("torch", "fp32") else "")})
    return pd.DataFrame(rows)


def _rows(device="cpu"):
    return dict(environment_rows({"cpu_count": 2, "python": "3.11.7"}, _runs(device)))


def test_thread_counts_are_integers():
    rows = _rows()
    assert rows["PyTorch: intra-op threads (training cells)"] == "2"
    assert rows["Keras (TF): intra-op threads (training cells)"] == "2"
    assert rows["cpu_count"] == "2"


def test_the_speed_trials_threads_are_their_own_row():
    """Cells at once with one thread, the trials alone with two: the table says both (audit: "intra-op threads 1"
    was read as the threads behind every speed verdict)."""
    trials = pd.DataFrame({"framework": ["torch", "torch", "tf"], "threads": [2, 2, 2]})
    rows = dict(environment_rows({"cpu_count": 2}, _runs("cpu"), trials))
    assert rows["PyTorch: threads (speed trials)"] == "2" and rows["Keras (TF): threads (speed trials)"] == "2"


def test_build_time_cuda_is_labelled_build_info_and_not_shown_as_present_on_a_cpu_run():
    rows = _rows("cpu")
    cuda = next(v for k, v in rows.items() if "CUDA version TensorFlow was built with" in k)
    assert cuda.startswith("12.5.1") and "this run used no GPU" in cuda
    cudnn = next(v for k, v in rows.items() if "cuDNN version TensorFlow was built with" in k)
    assert cudnn.startswith("9 ")  # 9, not 9.0
    gpu = next(v for k, v in _rows("NVIDIA H100 80GB HBM3").items() if "CUDA version TensorFlow" in k)
    assert gpu == "12.5.1"


def test_amp_api_is_a_list_one_item_per_precision_in_display_order():
    rows = _rows()
    assert rows["PyTorch: AMP API per precision"] == ["fp32: none", "fp16: torch fp16 api", "bf16: torch bf16 api"]


def test_initial_weights_list_each_file_once():
    row = next(d for d in framework_differences(_runs()) if d["item"] == "Initial weights")
    assert row["torch_used"] == "shared file m-s0.npz, made by torch default initialisers, seed 0"
    assert row["torch_used"].count("m-s0.npz") == 1 and row["keras_used"].count("m-s0.npz") == 1


def _vit_runs():
    """A vit run whose fp16 cells diverged: they still used the loss-scale settings and a float16 output layer."""
    rows = []
    for fw in ("torch", "tf"):
        for prec, status, out in (("fp32", "ok", "float32"), ("fp16", "diverged", "float16"),
                                  ("bf16", "ok", "bfloat16")):
            used = {"attention": "naive", "output_dtype": out, "ln_epsilon": 1e-5}
            if prec == "fp16":
                used |= {"init_scale": 32768.0, "growth_interval": 2000}
            rows.append({"framework": fw, "precision": prec, "status": status, "settings_used": json.dumps(used),
                         "framework_defaults": json.dumps({"init_scale": 65536.0 if fw == "torch" else 32768.0})})
    return pd.DataFrame(rows)


def test_a_setting_a_diverged_cell_used_is_not_called_not_used():
    rows = {d["item"]: d for d in framework_differences(_vit_runs())}
    assert rows["Initial loss scale (fp16)"]["torch_used"] == "32768"
    assert rows["Loss-scale growth interval (fp16)"]["keras_used"] == "2000"
    assert rows["Output layer dtype (mixed precision)"]["torch_used"] == "bfloat16; float16; float32"
    assert rows["Attention core dtypes (vit, mixed precision)"]["keras_used"] == "--attention naive"
    assert rows["Attention projection biases (vit)"]["torch_used"] != "not used"
    assert rows["BatchNorm momentum"]["torch_used"] == "not used"  # no cell of a vit run has a BatchNorm


def test_fp8_amp_api_names_what_ran_from_its_fp8_settings():
    runs = _runs().drop(columns="init_source")
    fp8 = {"converted": ["a", "b"], "scaling": "dynamic", "emulate": True}
    runs = pd.concat([runs, pd.DataFrame([
        {"framework": "torch", "precision": "fp8", "status": "ok", "device_name": "cpu", "amp_api": "none",
         "fp8_settings": json.dumps(fp8 | {"module": "torchao.float8.float8_linear.Float8Linear"})},
        {"framework": "tf", "precision": "fp8", "status": "ok", "device_name": "cpu", "amp_api": "none",
         "fp8_settings": json.dumps(fp8 | {"scaling": "delayed", "policy": "float8_from_float32"})}])],
        ignore_index=True)
    rows = dict(environment_rows({}, runs))
    torch_fp8 = [v for v in rows["PyTorch: AMP API per precision"] if v.startswith("fp8")]
    # the classes and policy as the children read them back (an audit: "torchao" was said where nothing recorded it)
    assert torch_fp8 == ["fp8: torchao.float8.float8_linear.Float8Linear on 2 layers, dynamic scaling, emulated: "
                         "float32 matmuls of dequantized values"]
    keras = rows["Keras (TF): AMP API per precision"]
    assert "fp8: Keras dtype policy float8_from_float32 on 2 layers, delayed scaling" in keras


def test_values_two_models_used_differently_are_listed_model_by_model():
    """The audit's "PyTorch, this run: 0; 0.05 | Keras, this run: 0.05; None": two unordered lists that read as if
    the frameworks disagreed; per model, the columns line up."""
    rows = []
    for fw, plain in (("torch", 0.0), ("tf", None)):
        for model, decay in (("simple_cnn", plain), ("vit", 0.05)):
            rows.append({"framework": fw, "model": model, "precision": "fp32", "status": "ok",
                         "settings_used": json.dumps({"weight_decay": decay}), "framework_defaults": "{}"})
    row = {d["item"]: d for d in framework_differences(pd.DataFrame(rows))}["Weight decay semantics"]
    assert row["torch_used"] == "simple_cnn 0; vit 0.05" and row["keras_used"] == "simple_cnn None; vit 0.05", row


def test_a_cpu_flag_row_says_it_is_a_flag_not_a_kernel():
    """The audit: "cpu_fp16_hardware | True" beside fp16 steps 45-107x slower than fp32 read as fp16 in hardware."""
    rows = dict(environment_rows({"cpu_fp16_hardware": True, "cpu_bf16_hardware": False}, _runs("cpu")))
    label = next(k for k in rows if k.startswith("cpu_fp16_hardware"))
    assert "avx512_fp16 or amx_fp16 in the CPU's flags" in label and "speed" in label and rows[label] == "True"
