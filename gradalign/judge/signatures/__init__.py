"""The signatures of known accumulation bugs, each read from the recorded numbers of a comparison.

Every signature returns a Diagnosis when it fits and None otherwise: `decisive` (bookkeeping,
data, model structure) and `gradient` (the shape of the first failing gradient). A new diagnosis
is one function in one of them, listed in `judge.diagnose`.
"""

from .common import failing, finite, first_gradient_failure
from .decisive import (
    batchnorm,
    card_loss,
    data_order,
    dropout_rng,
    lr_schedule,
    non_finite,
    replica_divergence,
    step_in_window,
    window_bookkeeping,
)
from .gradient import (
    clip_per_micro,
    grad_accum_dtype,
    loss_scale,
    token_normalization,
    zero_grad_in_window,
)

__all__ = [
    "batchnorm",
    "card_loss",
    "clip_per_micro",
    "data_order",
    "dropout_rng",
    "failing",
    "finite",
    "first_gradient_failure",
    "grad_accum_dtype",
    "loss_scale",
    "lr_schedule",
    "non_finite",
    "replica_divergence",
    "step_in_window",
    "token_normalization",
    "window_bookkeeping",
    "zero_grad_in_window",
]
