"""What every PyTorch child imports first, whether started as `python -m amp_compare.torch_impl` or forked from the
harness's pre-imported parent (kit/zygote.py): the module that trains."""

TRAIN_MODULE = "amp_compare.torch_impl.train"

# Imported by every cell after its framework, lazily (its first optimizer imports torch._dynamo; the fp8 twin's
# layer check imports torchao's Float8Linear): the pre-imported parent imports them too (kit/zygote.py), each
# where it is installed.
PRELOAD = ("torch._dynamo", "torchao.float8.float8_linear")
