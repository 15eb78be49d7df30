"""What every PyTorch child imports first, whether started as `python -m amp_compare.torch_impl` or forked from the
harness's pre-imported parent (kit/zygote.py): the module that trains."""

TRAIN_MODULE = "amp_compare.torch_impl.train"
