"""The signatures of known accumulation bugs, each read from the recorded numbers of a comparison.

Every signature returns a Diagnosis when it fits and None otherwise: `decisive` (bookkeeping,
data, model structure) and `gradient` (the shape of the first failing gradient). A new diagnosis
is one function in one of them, listed in `judge.diagnose`.
"""

from .accum_dtype import grad_accum_dtype
from .accumulation import grad_not_cleared, penalty_not_scaled
from .batch_size import batch_size
from .batchnorm import batchnorm
from .buffers import buffers_in_forward
from .clip_counted import clip_per_micro_counted, clip_per_micro_unengaged
from .clipping import clip_before_unscale, clip_per_micro, scale_before_clip
from .common import failing, finite, first_gradient_failure
from .cross_sample import cross_sample_gradient, cross_sample_loss, rows_differ
from .decay import weights_decayed
from .decisive import (
    card_loss,
    data_order,
    non_finite,
    replica_divergence,
    step_in_window,
    window_bookkeeping,
)
from .frozen import frozen_inside_window, trained_from_another_update
from .grad_hooks import grad_hooks
from .gradient import loss_scale, loss_term_scale
from .items import batch_targets
from .learning_rate import lr_scaled, lr_schedule
from .losses import loss_averaging
from .non_finite_grads import non_finite_gradient
from .optimizer import optimizer_settings, optimizer_type
from .paired import (
    scale_beside_other_samples,
    scale_beside_unseen_change,
    scale_under_reweighting,
    size_beside_other_samples,
    with_loss_scale,
    zero_grad_beside_other_samples,
)
from .random_draws import dropout_rng, dropout_stopped
from .reweighting import token_normalization
from .skips import overflow_carried, scaler_skips, step_skipped
from .step_count import group_step_count, step_count
from .thresholds import clip_threshold, clip_threshold_recorded
from .window_steps import (
    micro_batch_missing,
    scaler_per_micro,
    unrecorded_micro_batches,
    weights_changed_in_window,
    written_between_micro_steps,
)
from .zero_grad import zero_grad_counted, zero_grad_in_window

__all__ = [
    "batch_size",
    "batch_targets",
    "batchnorm",
    "buffers_in_forward",
    "card_loss",
    "clip_before_unscale",
    "clip_per_micro",
    "clip_per_micro_counted",
    "clip_per_micro_unengaged",
    "clip_threshold",
    "clip_threshold_recorded",
    "cross_sample_gradient",
    "cross_sample_loss",
    "data_order",
    "dropout_rng",
    "dropout_stopped",
    "failing",
    "finite",
    "first_gradient_failure",
    "frozen_inside_window",
    "grad_accum_dtype",
    "grad_hooks",
    "grad_not_cleared",
    "group_step_count",
    "loss_averaging",
    "loss_scale",
    "loss_term_scale",
    "lr_scaled",
    "lr_schedule",
    "micro_batch_missing",
    "non_finite",
    "non_finite_gradient",
    "optimizer_settings",
    "optimizer_type",
    "overflow_carried",
    "penalty_not_scaled",
    "replica_divergence",
    "rows_differ",
    "scale_before_clip",
    "scale_beside_other_samples",
    "scale_beside_unseen_change",
    "scale_under_reweighting",
    "scaler_per_micro",
    "scaler_skips",
    "size_beside_other_samples",
    "step_count",
    "step_in_window",
    "step_skipped",
    "token_normalization",
    "trained_from_another_update",
    "unrecorded_micro_batches",
    "weights_changed_in_window",
    "weights_decayed",
    "window_bookkeeping",
    "with_loss_scale",
    "written_between_micro_steps",
    "zero_grad_beside_other_samples",
    "zero_grad_counted",
    "zero_grad_in_window",
]
