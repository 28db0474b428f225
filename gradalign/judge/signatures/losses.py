"""Losses averaged or logged differently: only the recorded losses disagree, while the weights
and gradients (the training) are the same.
"""

from __future__ import annotations

import math

import numpy as np

from ..results import FAIL, Comparison, Diagnosis
from .clipping import SCALE_ONCE, scale_behind_clip, scale_of, window_of
from .common import finite, times, whole_ratio, window

_UNSCALED = (
    "record each micro-batch's own unscaled loss (before dividing it by K); a loss summed over "
    'the micro-batch\'s items (reduction="sum") as `micro(loss_sum=loss, items=n)`'
)
# the two ways a window's losses come out 1/K of the baseline's while the training is the same
_ONE_KTH = (
    "the loss recorded for each micro-batch is the one already divided by K, or a sum over its "
    'items (reduction="sum", as the baseline\'s over the whole batch) averaged as a mean'
)


def loss_averaging(c: Comparison) -> Diagnosis | None:
    """Only the losses disagree: the training is the same, the recorded losses are averaged
    (or logged) differently."""
    status = {check.name: check.status for check in c.checks}
    tensors_fine = all(status.get(n) != FAIL for n in ("weights", "gradients"))
    if status.get("losses") != FAIL:
        return None
    ratios = [
        r.merged_loss / r.base_loss
        for r in c.results
        if r.base_loss and not r.loss_ok and math.isfinite(r.merged_loss / r.base_loss)
    ]  # a loss not finite is `non-finite`'s: no ratio ("nan times the baseline's")
    q = float(np.median(ratios)) if ratios else math.nan
    k = window(c)
    if not tensors_fine:
        return _divided_beside(c, ratios, k)
    evidence = {"window_loss_ratio": finite(q), "K": k}
    if status.get("weights") is None:  # a log of losses alone (card logs: `card-loss`)
        if status.get("norms before clipping") == FAIL:  # the gradient's printed norm too
            return _scaled_norms(c, q, evidence)
        return None if len(c.merged.cards) > 1 else _scaled_losses(q, k, ratios, evidence)
    if not ratios:  # only losses not finite disagree
        return None
    hidden = scale_behind_clip(c, q)
    if hidden is not None:
        return hidden
    if math.isfinite(q) and abs(q * k - 1) <= 0.05:
        how = f"the merged window losses are {q:.4g} times the baseline's, about 1/K: " + _ONE_KTH
        fix = _UNSCALED
    else:
        found = _averaged_otherwise(c, q, evidence, ratios)
        if found is None:
            return None
        how, fix = found
    return Diagnosis(
        "loss-averaging",
        "only the losses disagree while the weights and gradients agree within noise: " + how,
        evidence,
        fix,
    )


# where a run written in the run format (another framework's) keeps each micro-batch's count
IN_THE_FORMAT = " (a run written in the run format: series micro/items, write_run's micro_items)"


def _averaged_otherwise(
    c: Comparison, q: float, evidence: dict, ratios: list[float]
) -> tuple[str, str] | None:
    """Why only the losses differ, where the ratio is not 1/K: a loss summed (or divided) over
    W ranks before it was recorded, losses of micro-batches of unequal sizes recorded already
    scaled by their shares (the window's mean weights them by their counts again), means
    weighted otherwise (class weights, tokens) averaged equally (ratios near 1 that vary by
    update), or else recorded losses that are not the ones backpropagated; None where 16-bit
    losses judged without a reference stand within 1% of each other (rounding no fixed
    tolerance foresaw is as likely as a loss averaged otherwise)."""
    world = c.merged.world_size
    found = world > 1 and math.isfinite(q)
    for scale, what in ((world, "summed over"), (1 / world, "divided by the number of")):
        if found and abs(q / scale - 1) <= 0.05:
            evidence["world_size"] = world
            return (
                f"the merged window losses are {q:.4g} times the baseline's, about "
                f"{'W' if scale > 1 else '1/W'} (W={world}): the loss each rank recorded was "
                f"{what} the ranks (an all_reduce of the loss before micro()), not its own",
                "record each rank's own mean loss in micro() (gradalign averages the ranks); "
                "to log a global loss, average it over the ranks (all_reduce, then divide by W)",
            )
    sizes = c.merged.micro_samples
    uneven = sizes is not None and len(set(sizes.tolist())) > 1
    evidence["micro_batch_sizes_vary"] = uneven
    if uneven:  # the window's mean is weighted by those counts (Run.window_losses)
        return (
            f"the merged window losses are {times(q)} times the baseline's (median over the "
            "failing updates): the micro-batches differ in size and each window's mean weights "
            "their losses by their counts, so each recorded loss must be its own micro-batch's "
            "mean; one already scaled by its share of the batch (or by 1/K) is weighted twice",
            "record each micro-batch's own mean loss, before scaling it by its share of the "
            "batch, with its item count where the loss is a mean over items (`micro(loss, "
            "items=n)`, or `micro(loss_sum=..., items=n)`)" + IN_THE_FORMAT,
        )
    rounded = c.reference is None and c.dtype in ("float16", "bfloat16")
    if rounded and math.isfinite(q) and abs(q - 1) <= 0.01:
        return None  # 16-bit losses within 1% without a reference: rounding, as likely
    varies = bool(ratios) and (max(ratios) - min(ratios)) > 1e-4 * abs(q)  # not one scale
    if math.isfinite(q) and abs(q - 1) <= 0.05 and varies and c.merged.micro_items is None:
        return (
            f"the merged window losses are {times(q)} times the baseline's (median over the "
            "failing updates), near 1: each micro-batch's loss is likely a mean weighted "
            "otherwise than by its samples (class weights, a count of tokens or of valid "
            "targets), and the window's plain mean of such means is not the batch's",
            "give each micro-batch's total weight with its mean loss, `micro(loss, items=w)` "
            "(its sum of class weights, tokens or valid targets), so the window mean is "
            "weighted as the batch's" + IN_THE_FORMAT + "; or record each micro-batch's own "
            "unscaled mean loss, the one backpropagated",
        )
    return (
        f"the merged window losses are {times(q)} times the baseline's (median over the failing "
        "updates): the losses recorded are not the mean losses the gradients came from",
        "record each micro-batch's own unscaled mean loss (the one backpropagated, before "
        "dividing it by K), with its item count where micro-batches differ in size" + IN_THE_FORMAT,
    )


def _scaled_norms(c: Comparison, q: float, evidence: dict) -> Diagnosis | None:
    """Logs whose losses and printed gradient norms (before clipping) both stand K (1/K, K+1)
    times apart at update 0: the loss the gradient comes from was scaled, not its print alone
    (a model that ignores the Trainer's num_items_in_batch). Read with -k 1, K is the whole
    number the norms' ratio is."""
    pb, pm = c.baseline.grad_norm_pre_clip, c.merged.grad_norm_pre_clip
    if pb is None or pm is None or not len(pb) or not len(pm) or not pb[0]:
        return None
    ratio = float(pm[0] / pb[0])
    scale = scale_of(c, ratio) if math.isfinite(ratio) and ratio > 0 else None
    if scale is None or scale == 1:  # read with -k 1, a ratio near 1 says no K
        return None
    first = c.results[0] if c.results and c.results[0].update == 0 else None
    if first is None or (not first.loss_ok and not _scaled_alike(first, ratio)):
        return None  # both runs' first losses come from the same weights: only a print
        # scaled as the gradient (or not at all) leaves them so; a step inside the window
        # moves them by other amounts (a norm 0.48x, the losses 0.99x: not a scale)
    k = window_of(c, scale)
    evidence.update(norm_ratio=finite(ratio), K=k)
    return Diagnosis(
        "loss-scale",
        f"the gradient norm the merged log prints is {ratio:.4g} times the baseline's at update "
        f"0 (K={k}), and its window losses {q:.4g} times: the loss the gradient comes from was "
        "scaled, not only its print (a model that ignores the num_items_in_batch it is given, "
        "or a loss not divided by K)",
        evidence,
        SCALE_ONCE + "; a transformers model must take num_items_in_batch (**kwargs in "
        "its forward) or set model_accepts_loss_kwargs = False",
    )


def _scaled_alike(r, ratio: float) -> bool:
    """Whether an update's window losses stand `ratio` apart (within 5%): the loss the
    gradient comes from, printed as it was scaled."""
    q = r.merged_loss / r.base_loss if r.base_loss else math.nan
    return math.isfinite(q) and abs(q / ratio - 1) <= 0.05


SCATTERED = 0.5  # relative spread of the ratios one micro-batch's loss (not a mean) shows


def _scaled_losses(q: float, k: int, ratios: list[float], evidence: dict) -> Diagnosis | None:
    """Losses alone, K (or 1/K) times the baseline's at every failing update: scaled, but no
    weights or gradients say whether in print only or in the loss the gradient comes from."""
    spread = (max(ratios) - min(ratios)) / abs(q) if ratios and q else math.inf
    per_update = k == 1 and math.isfinite(q) and q > 0  # one line per update: K unknown
    if per_update:
        k = whole_ratio(q)
    scale = next((s for s in (k, 1 / k) if math.isfinite(q) and abs(q / s - 1) <= 0.05), None)
    if k < 2 or scale is None or spread > SCATTERED:
        return None
    said, how = ("K", "K times its mean") if scale == k else ("1/K", "already divided by K")
    found = f"about {said}: each micro-batch's loss is {how}"
    if spread > 0.05:  # one micro-batch's loss each, scattered about its window's mean
        found = (
            f"about {said} in the median, scattered by {spread:.0%} as one micro-batch's loss "
            f"scatters about its window's mean: each line is likely one micro-batch's loss "
            f"(the window's last, printed at the step) {'times' if scale == k else 'divided by'} "
            "K, not the window's mean"
        )
    if per_update:  # read with -k 1: the whole number is the K it would be
        what = (
            ("their sum, not their mean" if scale == k else "their mean divided by K again")
            if spread <= 0.05
            else f"one micro-batch's loss {'times' if scale == k else 'divided by'} K (the "
            f"window's last, printed at the step; scattered by {spread:.0%} as one micro-batch's "
            "loss scatters about the window's mean), not their mean"
        )
        found = (
            f"a whole number: read with -k 1 (one loss per update), a run accumulating K={k} "
            f"micro-steps whose update's loss is {what}"
        )
    return Diagnosis(
        "loss-averaging",
        f"the merged window losses are {q:.4g} times the baseline's at every update, {found}. "
        "The logs print no weights or gradients, so they cannot tell a loss scaled in print "
        "only from one the gradient comes from (`loss-scale`)",
        evidence,
        "print each micro-batch's own loss, before any division by K, and let gradalign "
        "average the window; print the weights or gradients too, so the training itself is "
        "compared",
    )


READ_OFF_BACKWARD = frozenset({"transformers", "lightning", "accelerate"})  # integrations


def _divided_beside(c: Comparison, ratios: list[float], k: int) -> Diagnosis | None:
    """The losses recorded divided by K (each merged window loss whose loss fails, times K,
    within what the loss check allows of the baseline's; two at least) where the tensors fail
    too: a logging bug
    that holds whatever else differs (with the losses off, no loss tells a kink's or a noise
    element's divergence from a bug, and the tensors are judged without that leave). Read
    beside the gradient shapes (diagnose.BESIDE_SHAPES), so a bug in the gradients is named
    first. Not for a run an integration recorded: it reads each loss off what the framework
    backpropagated, so losses 1/K of the baseline's are the gradient's own scale (a loss divided
    by K twice, named `loss-scale`), not a logging bug (its fix, "record the unscaled loss",
    named an API no Trainer user calls)."""
    off = [r for r in c.results if r.base_loss and math.isfinite(r.base_loss) and not r.loss_ok]
    if k < 2 or len(off) < 2 or c.merged.config.get("framework") in READ_OFF_BACKWARD:
        return None
    if not all(abs(r.merged_loss * k - r.base_loss) <= r.loss_allowed for r in off):
        return None
    return Diagnosis(
        "loss-averaging",
        f"the merged window losses are 1/K (K={k}) of the baseline's at every update whose "
        f"losses differ ({len(off)}, from update {off[0].update}): {_ONE_KTH}. The weights or "
        "gradients fail as well, "
        "which this does not explain: with the losses off, the judge reads no loss to tell a "
        "rounding divergence from a bug; fix the recorded loss and compare again",
        {"window_loss_ratio": finite(float(np.median(ratios))), "K": k, "tensors_fail": True},
        _UNSCALED,
    )
