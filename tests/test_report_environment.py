"""The Environment section and the initial-weights row say what a reader can take at face value."""

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
    assert rows["PyTorch: intra-op threads"] == "2" and rows["Keras (TF): intra-op threads"] == "2"
    assert rows["cpu_count"] == "2"


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
