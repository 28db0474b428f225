"""Micro-batches weighted otherwise than by their share of the window's items: each one's mean
divided by K over unequal item counts (tokens, samples), read from the accumulated gradient of
the first update whose gradient fails (`token_normalization`)."""

from __future__ import annotations

import numpy as np

from ..distributed import listed
from ..kink_shape import JUMP_SHARE
from ..results import Comparison, Diagnosis, UpdateResult
from ..stepped_choice import one_input_shares
from .clipping import unclipped
from .common import (
    failing_share,
    finite,
    losses_given,
    noise_share,
    normalized_by_window,
    own_noise,
    scaled_error,
)
from .decisive import forward_parted
from .norms import apart, norm_before_clip

# the whole gradient's error, in its own noise, beyond which a reweighting the noise hides is
# read where the gradients failed: two runs' independent roundings part it by about √2
TWO_DRAWS = 2.0


def token_normalization(c: Comparison, r: UpdateResult, scale: float = 1.0) -> Diagnosis | None:
    """Each micro-batch's mean divided by K, with unequal item counts: a reweighting of the
    micro-batches by N / (K n_j), so the gradient error is bounded by the imbalance. `scale`
    divides the merged gradient first (another cause scaled it: see `with_loss_scale`). Without
    item counts, the micro-batches' rows (`batch=`) count: a per-sample loss."""
    items, k, unit = c.merged.micro_items, c.merged.accum_steps, "items"
    if items is None:
        items, unit = c.merged.micro_samples, "samples"
    if items is None or k < 2 or (scale == 1.0 and normalized_by_window(c.merged)):
        return None  # beside a scale, a mean the model took despite num_items_in_batch
    if unit == "items" and losses_given(c.merged) and forward_parted(c, r):
        return None  # item-weighted window losses apart from the same weights: the forward's
    w = c.merged.window(r.update)
    counts = items[w.start : w.stop]
    held = counts[counts > 0]  # an empty micro-batch adds nothing either way (its mean clamped)
    if held.size == 0 or counts.min() < 0 or counts.min() == counts.max():
        return None
    by = _divisor(r, k, counts.size, scale)
    weights = counts.sum() / (by * held)  # what mean-per-micro-batch / `by` gives each one
    imbalance = float(np.abs(weights - 1).max())
    error = scaled_error(c, r, scale)
    if error is None or not 0 < error <= 2 * imbalance:
        return None
    where, failing = "", {}
    if error <= noise_share(c, r):
        # a reweighting that moves the gradient no further than its own noise is not told
        # from it (a clean padded run failing elsewhere), nor is what another cause leaves;
        # unless the whole gradient stands beyond what two runs' roundings part it by (each
        # draw one noise, √2 apart) and the gradients that failed lie within the bound
        own = own_noise(c, r)
        beyond = failing_share(c, r) if scale == 1.0 and own is not None else None
        if beyond is None or error <= TWO_DRAWS * own or beyond[0] > 2 * imbalance:
            return None
        error, failed = beyond
        where = f" where it failed ({listed(failed, 4)}; over the whole model within its noise)"
        failing = {"failed_tensors": failed}
    if _one_input_alone(c, r, w):
        return None
    divided = "K" if by == k else f"the window's {by} micro-batches"
    how, off = f"each was weighted equally (its mean divided by {divided})", ""
    if scale != 1.0:  # the scale beside it says how the means were scaled, not K
        how = f"each micro-batch's loss was its own mean, weighted alike whatever its {unit}"
        off = ", once the scale named beside it is divided out"
    evidence: dict = {}
    size = norm_before_clip(c, r) if scale == 1.0 and r.grad_ratio is not None else None
    if size is not None:  # the fit before clipping too: both read the same gradients
        other = _unsure_scale(size, k, r.grad_ratio * unclipped(c, r))
        if other is not None:  # the fit says 1 and the norm another scale: scaled so
            how = f"each was weighted equally (its own mean, {other})"
            evidence["norm_ratio"] = finite(size)
    return Diagnosis(
        "token-normalization",
        f"at update {r.update} the micro-batches hold {', '.join(_count(n) for n in counts)} "
        f"{unit}, yet {how}: {unit} are weighted up to {imbalance:.1%} wrong, and the gradient "
        f"is {error:.3g} off{where} (relative L2{off}, cosine {r.grad_cosine:.6f}){_own_loss(c)}",
        {
            "update": r.update,
            "items_per_micro_batch": [int(n) if n == int(n) else float(n) for n in counts],
            "max_weight_error": imbalance,
            "grad_rel_l2": error,
            "grad_cosine": finite(r.grad_cosine),
            **failing,
            **evidence,
        },
        "normalize by the window's item count: count the items of all K micro-batches first, "
        "then backpropagate each micro-batch's summed loss divided by that total "
        "(loss_norm: items; the fix of transformers PR #34191)",
    )


def _divisor(r: UpdateResult, k: int, n: int, scale: float) -> int:
    """What each micro-batch's mean was divided by in a window of `n` micro-steps: K in a full
    one; in a short one, its own n where a scale was divided out (`scale` ≠ 1: the rest is a
    reweighting about equal shares) or the gradient stands nearer 1 than n/K, else K (a short
    last window of 6 and 4 samples, each mean over K=4, was read as items weighted up to 58%
    wrong: its scale, 2/4, folded into the reweighting)."""
    if n == k or scale != 1.0:
        return n
    ratio = r.grad_ratio
    return k if ratio is not None and ratio > 0 and apart(ratio, n / k) < apart(ratio, 1) else n


def _one_input_alone(c: Comparison, r: UpdateResult, w: range) -> bool:
    """Whether every failing gradient holds one input's share of one input while every
    micro-batch of the window holds two samples or more: a reweighting moves a micro-batch's
    samples' shares together, never one input's alone (a token routed to another expert in a
    clean mixture of experts whose micro-batches differ in size, model zoo run 190506, was
    named a reweighting). A micro-batch of one sample may be that input, where its term can
    hold the share of the error the reading asks (`_lone_sample_share`). `w`: the window's
    micro-steps."""
    rows = c.merged.micro_samples
    if rows is None:
        return False
    if _lone_sample_share(np.asarray(rows[w.start : w.stop], np.float64)) >= JUMP_SHARE:
        return False
    return one_input_shares(c, r) is not None


def _lone_sample_share(rows: np.ndarray) -> float:
    """The largest share of a reweighting's error that one micro-batch of one sample holds:
    each micro-batch's mean divided by K misweights it by Δ_j = 1/K − n_j/N, and its term
    Δ_j·(g_j − g) has an energy of about Δ_j²·σ²/n_j for samples whose gradients scatter by σ
    about the batch's (a term of many samples averages theirs out). 0 where no micro-batch
    holds one sample. At K=2 over 47 and 1 samples the one sample holds 98%, the reading's
    one input; model zoo run 296034 (K=6 over 4, 2, 8, 1, 17 and 16 samples) 61%, so a
    reweighting there is no one input's share, and a token's route, rank one, is not one
    (it was named `token-normalization`)."""
    held = rows[rows > 0]
    if held.size == 0 or not np.any(held == 1):
        return 0.0
    delta = 1 / held.size - held / held.sum()
    energy = delta**2 / held
    total = float(energy.sum())
    return float(energy[held == 1].max()) / total if total > 0 else 0.0


def _unsure_scale(norm: float, k: int, fitted: float) -> str | None:
    """Where the gradient's norm over the baseline's is nearer K (or 1/K) than 1 while its fit
    along the baseline's is nearer 1 (or turned past a right angle, no size at all): the words
    for both readings of how the means were scaled.
    A reweighting turned half away from the baseline's gradient shrinks the fit and grows the
    norm, so neither settles it alone (`paired._reweighted` names a scale where both agree)."""
    if not norm > 0 or k < 2:
        return None
    nearest = min((1.0, k, 1 / k), key=lambda v: apart(norm, v))
    if nearest == 1.0 or (fitted > 0 and apart(fitted, 1) >= apart(fitted, nearest)):
        return None
    fit = (
        f"while its fit along the baseline's, {fitted:.3g}, is nearer 1"
        if fitted > 0
        else f"while it is turned past a right angle from the baseline's (fit {fitted:.3g}), "
        "where no fit reads a size"
    )
    how = "not divided by K" if nearest == k else "divided by K twice"
    return (
        f"divided by K, or {how}: the gradient's norm is {norm:.3g} times the baseline's, "
        f"nearer {'K' if nearest == k else '1/K'}={nearest:.3g} than 1, {fit}; the fix below "
        "is right either way"
    )


def _own_loss(c: Comparison) -> str:
    """What a Trainer run with a compute_loss of the loop's own leaves open: the Trainer gave it
    num_items_in_batch, and the run cannot say whether it divided by it."""
    if c.merged.config.get("loss_normalized_by") != "a compute_loss of its own":
        return ""
    return (
        "; that is read from the gradient alone: the Trainer ran a compute_loss of the loop's own, "
        "given num_items_in_batch, and where it divides by that count (super().compute_loss "
        "does) the micro-batches were weighted right and the gap is another cause's, such as a "
        "term of the loss over each micro-batch as a whole (a router's load-balancing loss: "
        "cross-sample-loss)"
    )


def _count(n: float) -> str:
    """An item count as given: whole, or a weight (float items) to 4 digits."""
    return str(int(n)) if n == int(n) else f"{n:.4g}"
