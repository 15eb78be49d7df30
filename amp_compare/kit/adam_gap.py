"""The defaults-mode Adam gap: one Adam step of torch's formula and of Keras', on a child's real gradient.

Both numerics.py files call `adam_first_step_gap` on their first batch (`adam_formula_gap`); the report
words the result (harness/report/settings_check.py `adam_gap_text`). numpy only, no framework.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

# Each framework's own Adam epsilon, for the defaults-mode gap below: a child knows its own from the live
# optimizer and takes the other's from here (tests/test_numerics.py checks both against the installed versions).
ADAM_DEFAULT_EPSILON = {"torch": 1e-8, "tf": 1e-7}


def adam_first_step_gap(grads: Iterable, lr: float, beta_1: float, beta_2: float, eps_torch: float,
                        eps_keras: float) -> dict:
    """One Adam step from a fresh state, both frameworks' formulas, applied to the same real gradients.

    torch.optim.Adam: lr/(1-b1) * m / (sqrt(v)/sqrt(1-b2) + eps_torch), eps added to the bias-corrected
    sqrt(v). keras.optimizers.Adam: lr*sqrt(1-b2)/(1-b1) * m / (sqrt(v) + eps_keras), eps added to the
    uncorrected one. m = (1-b1) g, v = (1-b2) g**2 at step 1. In float64, so the figure is the formulas'
    difference on this gradient, not float32 rounding. Over the elements with a non-zero gradient:
    the max and median of |u_torch - u_keras| / |u_torch|, and the share above 1%.
    """
    g = np.concatenate([np.asarray(a, dtype=np.float64).ravel() for a in grads])
    g = g[(g != 0) & np.isfinite(g)]
    if not len(g):
        return {"adam_gap_elements": 0, "adam_gap_max": float("nan"), "adam_gap_median": float("nan"),
                "adam_gap_over_1pct": float("nan")}
    m, v = (1 - beta_1) * g, (1 - beta_2) * g**2
    torch_update = lr / (1 - beta_1) * m / (np.sqrt(v) / np.sqrt(1 - beta_2) + eps_torch)
    keras_update = lr * np.sqrt(1 - beta_2) / (1 - beta_1) * m / (np.sqrt(v) + eps_keras)
    rel = np.abs(torch_update - keras_update) / np.abs(torch_update)
    return {"adam_gap_elements": int(len(g)), "adam_gap_max": float(rel.max()),
            "adam_gap_median": float(np.median(rel)), "adam_gap_over_1pct": float((rel > 0.01).mean())}
