"""Hyperparameters that look equal across PyTorch and Keras but are not: the one documented mapping.

In `aligned` mode both frameworks are configured to the same behaviour with the values below,
each written in its own framework's convention (`framework_settings`). In `defaults` mode each
framework gets none of these arguments and runs with its own out-of-the-box defaults; the
children then record the values they actually used, read from the live objects.

The report's "Framework differences" table lists every item of DIFFERENCES with the torch
default and the Keras default as each child read them from the installed versions (see
`describe_defaults()` in torch_impl/settings.py and keras_impl/settings.py), not typed here.
"""

from __future__ import annotations

from dataclasses import dataclass

from amp_compare.contract.config import RunConfig

# BatchNorm: torch updates running = (1 - m) * running + m * batch with m = 0.1;
# Keras updates moving = m * moving + (1 - m) * batch with m = 0.99 by default. The same
# behaviour is torch momentum 0.1 == Keras momentum 0.9.
BN_MOMENTUM_TORCH = 0.1
BN_EPSILON = 1e-5  # torch's default; Keras' default is 1e-3
LN_EPSILON = 1e-5  # LayerNorm: torch's default again; Keras' LayerNormalization default is 1e-3
GELU_APPROXIMATE = False  # the exact (erf) GELU: torch nn.GELU's default; keras.ops.gelu defaults to the tanh form


def keras_bn_momentum(torch_momentum: float) -> float:
    return 1.0 - torch_momentum


@dataclass(frozen=True)
class Difference:
    key: str  # the key each child's describe_defaults() fills in
    item: str
    why: str  # what differs and how aligned mode closes it


DIFFERENCES = [
    Difference("adam_epsilon", "Adam epsilon",
               "torch adds eps to the bias-corrected sqrt(v); Keras adds it to the uncorrected sqrt(v) (the "
               "paper's epsilon-hat), so equal values are not equal behaviour: in the first steps Keras' eps "
               "acts up to 1/sqrt(1-beta2)≈32× larger, and weights with tiny gradients move differently. "
               "Aligned: the same value on both sides and Keras runs keras_impl/optimizers.TorchAdam, torch's "
               "formula (tests/test_parity.py checks the two agree step by step); defaults: each framework's "
               "own Adam."),
    Difference("adam_formula", "Adam update formula",
               "Aligned: Keras uses keras_impl/optimizers.TorchAdam (eps added to the bias-corrected sqrt(v), bias "
               "corrections in float64, as torch.optim.Adam). Defaults: keras.optimizers.Adam, whose step at t=1 "
               "is lr·g/(|g| + eps/sqrt(1-beta2)) against torch's lr·g/(|g| + eps), so a weight whose gradient "
               "is near eps moves less in Keras; it also rounds 1 - beta2 through float32, a 6.5e-6 relative "
               "step-size error at t=1 (both figures derived in keras_impl/optimizers.py). In defaults mode each child "
               "also measures the gap on its own first-batch gradient (shown here when it ran)."),
    Difference("output_dtype", "Output layer dtype (mixed precision)",
               "torch autocast runs the final Linear in the half dtype and casts cross_entropy's input to "
               "float32. Keras' mixed-precision guide keeps the output layer float32: the logits, and the "
               "output layer's matmul, are then float32 in Keras but half in torch. Aligned: Keras' output "
               "Dense follows the policy (half), the loss is float32 on both sides; defaults: Keras' float32 "
               "output layer."),
    Difference("bn_momentum", "BatchNorm momentum",
               "Opposite conventions: torch's momentum weights the new batch, Keras' weights the old average. "
               "Aligned: torch 0.1 == Keras 0.9."),
    Difference("bn_epsilon", "BatchNorm epsilon", "torch 1e-5, Keras 1e-3. Aligned: 1e-5 on both sides."),
    Difference("stride2_padding", "Stride-2 'same' padding",
               "TF's 'same' pads an even-sized input only at the bottom/right; torch pads symmetrically. "
               "Aligned: explicit symmetric ZeroPadding2D then 'valid' in Keras."),
    Difference("weight_decay", "Weight decay semantics",
               "torch Adam's weight_decay is L2 added to the gradient; Keras Adam's is decoupled (AdamW-like). "
               "Aligned: Adam trains without weight decay on either side; --optimizer adamw (the vit's) decouples "
               "it on both (the AdamW row)."),
    Difference("loss_reduction", "Loss reduction",
               "Both average the per-example loss over the batch; named 'mean' in torch and "
               "'sum_over_batch_size' in Keras."),
    Difference("init_scale", "Initial loss scale (fp16)", "torch GradScaler 2**16, Keras LossScaleOptimizer "
               "2**15. Aligned: the configured --init-scale on both sides."),
    Difference("growth_interval", "Loss-scale growth interval (fp16)",
               "Clean steps before the scale doubles. Aligned: the configured --growth-interval on both sides."),
    Difference("ln_epsilon", "LayerNorm epsilon (vit)", "torch 1e-5, Keras 1e-3 (added to the variance before "
               "the square root). Aligned: 1e-5 on both sides."),
    Difference("gelu_approximate", "GELU form (vit)",
               "torch nn.GELU is exact (erf) unless approximate='tanh'; Keras' keras.activations.gelu is exact by "
               "default but keras.ops.gelu defaults to the tanh approximation (up to ~1e-3 apart). Aligned: the "
               "exact form, set explicitly on both sides."),
    Difference("mha_bias", "Attention projection biases (vit)",
               "Both frameworks' attention layers give the query/key/value/output projections a bias by default "
               "(torch nn.MultiheadAttention bias, Keras MultiHeadAttention use_bias); the vit keeps them on both "
               "sides and kit/weights.py moves them with the kernels (Keras' are (heads, head_dim))."),
    Difference("mha_dropout", "Attention dropout (vit)",
               "Both default to none (torch nn.MultiheadAttention dropout / F.scaled_dot_product_attention "
               "dropout_p, Keras MultiHeadAttention dropout); Keras takes its fused ops.dot_product_attention path "
               "only without dropout. The vit uses none on either side."),
    Difference("token_dtype", "ViT token stream dtype (mixed precision)",
               "torch autocast casts op by op: the class token and position embedding are float32 parameters, so "
               "the embedding add and every residual add (float32 stream + half branch) promote to float32, and "
               "LayerNorm reads float32. A Keras layer casts its inputs to its policy's dtype: under a mixed "
               "policy the whole stream is half, and each LayerNorm's input is rounded to half first. Aligned: "
               "Keras' embed, residual adds, LayerNorms and class-token slice compute in the weights' dtype "
               "(float32 under a mixed policy), the stream torch's autocast keeps; defaults: the policy's half."),
    Difference("attention_core", "Attention core dtypes (vit, mixed precision)",
               "Not alignable by a setting: torch's F.scaled_dot_product_attention runs Q·Kᵀ, softmax and ·V in one "
               "fused kernel (half inputs and output, float32 accumulation inside); Keras' MultiHeadAttention "
               "(ops.dot_product_attention) computes the unscaled Q·Kᵀ as a half einsum, then scales and softmaxes "
               "in float32 and multiplies by V in half. What each ran is the dtype audit's attention rows."),
    Difference("adamw_weight_decay", "AdamW weight decay",
               "Both decouple it (p -= lr·wd·p before the Adam step), at different defaults: torch AdamW 0.01, "
               "Keras AdamW 0.004. --weight-decay is set on both sides in either mode (a hyperparameter, as --lr); "
               "aligned, Keras runs keras_impl/optimizers.TorchAdam given the weight decay (torch's epsilon "
               "placement)."),
    Difference("lr_schedule", "Learning-rate schedule",
               "Neither framework schedules by default. warmup-cosine: kit/schedule.py's step-indexed factor, torch "
               "through LambdaLR advanced after every update the optimizer really made (a step post-hook: a step "
               "GradScaler skips does not count), Keras as a LearningRateSchedule of optimizer.iterations (which a "
               "skipped LossScaleOptimizer step does not advance): the same index, so the same rates."),
    Difference("initial_weights", "Initial weights",
               "Each framework has its own initialisers (torch: Kaiming-uniform; Keras: Glorot-uniform, zero "
               "biases). Aligned (--init shared): one set of weights made once and copied to every cell."),
]


def framework_settings(cfg: RunConfig) -> dict[str, object]:
    """The arguments a child passes to its framework, in that framework's convention.

    An empty dict in `defaults` mode: pass nothing, let the framework choose.
    """
    if cfg.comparison == "defaults":
        return {}
    settings: dict[str, object] = {
        "adam_epsilon": cfg.adam_epsilon,
        "bn_epsilon": BN_EPSILON,
        "stride2_padding": "symmetric",
        "init_scale": cfg.init_scale,
        "growth_interval": cfg.growth_interval,
        "adam_formula": "torch",  # Keras: keras_impl/optimizers.TorchAdam
        "output_dtype": "policy",  # the output layer computes in the mixed policy's half dtype, as autocast's Linear
        "ln_epsilon": LN_EPSILON,
        "gelu_approximate": GELU_APPROXIMATE,
        "token_dtype": "parameters",  # Keras' vit stream layers in the weights' dtype (float32), as autocast keeps it
    }
    settings["bn_momentum"] = (BN_MOMENTUM_TORCH if cfg.framework == "torch"
                               else keras_bn_momentum(BN_MOMENTUM_TORCH))
    return settings
