"""What a torch cell trained with: torch's own defaults, and the settings read back from the live objects.

Read beside keras_impl/settings.py; harness/report/settings_check.py compares the two children's records
per cell (contract/mapping.py lists the items).
"""

from __future__ import annotations

import torch
from torch import nn

from amp_compare.contract.config import RunConfig
from amp_compare.torch_impl import amp, schedule, vit


def describe_defaults() -> dict[str, object]:
    """This torch's own defaults for each item of amp_compare.contract.mapping.DIFFERENCES, read from fresh objects."""
    adam = torch.optim.Adam([nn.Parameter(torch.zeros(1))])
    bn = nn.BatchNorm2d(1)
    scaler = torch.amp.GradScaler("cpu")
    return {
        "adam_epsilon": adam.defaults["eps"],
        "bn_momentum": bn.momentum,
        "bn_epsilon": bn.eps,
        "stride2_padding": "padding=1: symmetric",
        "weight_decay": f"L2 added to the gradient (default {adam.defaults['weight_decay']})",
        "loss_reduction": nn.CrossEntropyLoss().reduction,
        "init_scale": scaler.get_scale(),
        "growth_interval": scaler.get_growth_interval(),
        "initial_weights": "kaiming_uniform_(a=sqrt(5)) weights, uniform(±1/sqrt(fan_in)) biases",
        **vit.describe_defaults(),  # vit: LayerNorm, GELU, attention, AdamW, schedule, token stream
    }


def settings_used(model: nn.Module, optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler,
                  cfg: RunConfig) -> dict:
    """The values this run actually used, read back from the objects it trained with.

    Recorded in torch's own convention; harness/report/settings_check.py compares them with the Keras child's.
    cfg's precision gives the autocast dtype the run trains under, which decides the dtype of the final
    Linear (autocast runs linear/addmm in the half dtype).
    """
    group = optimizer.param_groups[0]
    used: dict[str, object] = {"loss_reduction": "mean", "weight_decay": group["weight_decay"]}
    if isinstance(optimizer, torch.optim.Adam):
        used.update(adam_epsilon=group["eps"], adam_beta_1=group["betas"][0], adam_beta_2=group["betas"][1],
                    adam_formula="torch")
    if isinstance(optimizer, torch.optim.SGD):
        used.update(sgd_momentum=group["momentum"], sgd_nesterov=group["nesterov"])
    used["learning_rate"] = group["lr"]
    used["lr_schedule"] = schedule.describe(optimizer)
    if isinstance(optimizer, torch.optim.AdamW):  # decoupled weight decay (contract/mapping.py adamw_weight_decay)
        used["adamw_weight_decay"] = group["weight_decay"]
    used.update(vit.settings_used(model, cfg))  # vit: LayerNorm eps, GELU form, token stream dtype
    bn = next((m for m in model.modules() if isinstance(m, nn.BatchNorm2d)), None)
    if bn is not None:
        used.update(bn_momentum=bn.momentum, bn_epsilon=bn.eps)
    strided = [m for m in model.modules()
               if isinstance(m, nn.Conv2d) and m.stride != (1, 1) and m.kernel_size == (3, 3)]
    if strided:
        pads = {m.padding for m in strided}
        used["stride2_padding"] = "symmetric" if pads == {(1, 1)} else "; ".join(map(str, sorted(pads)))
    used["output_dtype"] = str(amp.amp_setting(cfg.precision) or torch.float32).removeprefix("torch.")
    if isinstance(scaler, amp.FixedScaler):
        used["static_loss_scale"] = scaler.fixed_scale
    elif scaler.is_enabled():
        used.update(init_scale=scaler.get_scale(), growth_interval=scaler.get_growth_interval())
    # TF32 read back from torch (on, off, or mixed), as every Keras backend records it (keras_impl/backends.py)
    matmul, cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    used["tf32"] = "on" if matmul and cudnn else "off" if not (matmul or cudnn) else "mixed"
    return used
