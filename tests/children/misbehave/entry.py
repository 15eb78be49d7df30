"""What the pre-imported parent of this stand-in imports (kit/zygote.py): the real torch child's, since every cell
but the misbehaving one runs the real torch child."""

from amp_compare.torch_impl.entry import PRELOAD, TRAIN_MODULE  # noqa: F401
