"""What the pre-imported parent of this stand-in imports (kit/zygote.py). Where the child it runs is torch's (the
DDP mutant, tests/children/ddp_local_overflow.py, runs amp_compare.torch_impl), the real torch child's: a compare's
1-worker torch cells are forked from a parent that has torch, as the real ones are, instead of each importing torch
again. Behind a Keras child the parent imports nothing more: those tests run one cell each, whose import a preload
would only move into the parent."""

import os

if os.environ.get("AMP_COMPARE_TEST_FRAMEWORK_MODULE") in ("amp_compare.torch_impl",
                                                            "tests.children.ddp_local_overflow"):
    from amp_compare.torch_impl.entry import PRELOAD, TRAIN_MODULE  # noqa: F401
else:
    TRAIN_MODULE, PRELOAD = "amp_compare.kit.child", ()  # the zygote imports it for every child anyway
