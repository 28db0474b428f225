"""Signatures of bugs in how a loop accumulates: gradients carried over from the previous window,
a penalty counted K times, a loss scaler driven per micro-step, a micro-batch never
backpropagated, weights edited inside the window, losses averaged or logged differently.

Each reads a recorded fact or an exact algebraic relation between the recorded gradients, so a
match is evidence, not a guess; each returns None when its fact is absent.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np

from ...runs.model import Run, Tensors
from ..results import FAIL, Comparison, Diagnosis, UpdateResult
from .clipping import scale_behind_clip, scale_of, window_of
from .common import (
    finite,
    grad_norm,
    grads_of,
    noise_share,
    on_ranks,
    weights_of,
    whole_ratio,
    window,
)

EXPLAINED = 0.95  # a relation must explain this share of the gradient error (1 - residual share)


def _vector(tensors: Tensors, names: list[str]) -> np.ndarray:
    return np.concatenate([np.asarray(tensors[n], dtype=np.float64).ravel() for n in names])


def _explained(delta: np.ndarray, basis: np.ndarray) -> tuple[float, float]:
    """The least-squares coefficient a with delta ≈ a·basis, and the share it explains."""
    bb = float(basis @ basis)
    dd = float(delta @ delta)
    if bb <= 0 or dd <= 0:
        return 0.0, 0.0
    a = float(delta @ basis) / bb
    residual = float(np.linalg.norm(delta - a * basis)) / math.sqrt(dd)
    return a, 1.0 - residual


def flat64(values: np.ndarray) -> np.ndarray:
    return np.asarray(values, np.float64).ravel()


def per_tensor_fit(
    pairs: Iterable[tuple[str, np.ndarray, np.ndarray]],
) -> tuple[float, dict[str, float]]:
    """For (name, difference, basis) of each tensor: the share of all the differences together
    that each tensor's own multiple of its basis explains (1 − the residual's norm over theirs),
    and those multiples (the least-squares `_explained`)."""
    fitted, residual, total = {}, 0.0, 0.0
    for name, delta, basis in pairs:
        a, _ = _explained(delta, basis)
        fitted[name] = a
        residual += float(np.sum((delta - a * basis) ** 2))
        total += float(delta @ delta)
    return (1 - math.sqrt(residual / total) if total > 0 else 0.0), fitted


def _params(c: Comparison, grads: Tensors) -> list[str]:
    return [t.name for t in c.baseline.tensors if t.kind == "param" and t.name in grads]


def grad_not_cleared(c: Comparison, r: UpdateResult) -> Diagnosis | None:
    """zero_grad() never called: the merged gradient is the baseline's plus the previous window's
    merged gradient (times a constant, when the loop divides .grad every window), up to a share
    or to the reference's noise (bfloat16 autocast: 94.2% explained, the rest noise; zoo 9013)."""
    if r.update == 0:
        return None
    gb, gm, prev = (
        grads_of(c, c.baseline, r.update),
        grads_of(c, c.merged, r.update),
        grads_of(c, c.merged, r.update - 1),
    )
    if gb is None or gm is None or prev is None:
        return None
    base = _vector(gb, names := _params(c, gb))
    delta = _vector(gm, names) - base
    a, share = _explained(delta, _vector(prev, names))
    rest = np.linalg.norm(delta) * (1.0 - share) if c.reference is not None else np.inf
    if a <= 0 or (share < EXPLAINED and not rest <= noise_share(c, r) * np.linalg.norm(base)):
        return None
    within = "" if share >= EXPLAINED else ", the rest within the noise"
    return Diagnosis(
        "grad-not-cleared",
        f"at update {r.update} the merged gradient is the baseline's plus {a:.4g} times the "
        f"previous window's merged gradient ({share:.1%} of the difference explained{within}): "
        "gradients were carried over from one window into the next",
        {"update": r.update, "carried_fraction": a, "explained_share": share},
        "call optimizer.zero_grad() once per update, right after optimizer.step()",
    )


def penalty_not_scaled(c: Comparison, r: UpdateResult) -> Diagnosis | None:
    """A weight penalty l2·||w||² added to every micro loss without 1/K: the gradient error is
    exactly proportional to the weights the window started from (per tensor, or zero)."""
    gb, gm = grads_of(c, c.baseline, r.update), grads_of(c, c.merged, r.update)
    start = weights_of(c, c.baseline, None if r.update == 0 else r.update - 1)
    if gb is None or gm is None or start is None:
        return None
    pairs = (
        (name, flat64(gm[name]) - flat64(gb[name]), flat64(start[name]))
        for name in _params(c, gb)
        if np.size(start[name]) > 1  # one number is a multiple of any other: no evidence
    )
    share, fitted = per_tensor_fit(pairs)
    coefficients = [a for a in fitted.values() if abs(a) > 0]
    if share < EXPLAINED or not coefficients or max(coefficients) <= 0:
        return None
    k = window(c)
    a = max(coefficients)
    return Diagnosis(
        "penalty-not-scaled",
        f"at update {r.update} the merged gradient exceeds the baseline's by {a:.4g} times the "
        f"weights ({share:.1%} of the difference explained): a weight penalty was added to "
        f"each of the K={k} micro losses in full, i.e. counted K times; its coefficient is "
        f"about {a / (2 * (k - 1)) if k > 1 else a:.4g}",
        {
            "update": r.update,
            "gradient_minus_baseline_over_weights": {n: finite(v) for n, v in fitted.items()},
            "explained_share": share,
            "implied_l2": finite(a / (2 * (k - 1))) if k > 1 else None,
        },
        "add the penalty once per window: divide it by K in each micro loss (or add it to the "
        "accumulated gradient once, or use the optimizer's weight_decay)",
    )


def scaler_per_micro(c: Comparison) -> Diagnosis | None:
    """A GradScaler unscaled or updated inside the window (counted by the Recorder)."""
    calls = c.merged.scaler_calls
    if calls is None or calls.size == 0 or int(calls.max()) <= 1:
        return None
    first = int(np.flatnonzero(calls.max(axis=1) > 1)[0])
    unscales, updates = (int(v) for v in calls[first])
    where, ranks = on_ranks(c, "update/scaler_calls", first, above=1)
    return Diagnosis(
        "scaler-per-micro",
        f"the loss scaler was driven inside the window{where}: in window {first} "
        f"GradScaler.unscale_() ran {unscales} times and update() {updates} times (once each is "
        "right); every unscale divides the gradients accumulated so far by the scale again",
        {"first_window": first, "unscale_calls": unscales, "update_calls": updates, **ranks},
        "call scaler.unscale_() (before clipping), scaler.step() and scaler.update() once per "
        "window, after the K-th backward; keep one scale for all K micro-steps",
    )


def micro_batch_missing(c: Comparison) -> Diagnosis | None:
    """A micro-step after which no accumulated .grad was written (`micro/grad_writes`), or, in
    runs that recorded fingerprints instead, was bit for bit what it was after the one before:
    that micro-batch was never backpropagated."""
    run = c.merged
    if all(r.ok for r in c.results):
        return None
    empty = _empty_gradient(c)
    if empty is not None:
        return empty
    states = run.micro_grad_state if run.micro_grad_state is not None else run.micro_grad_writes
    if states is None:
        return None
    params = np.array([t.kind == "param" for t in run.tensors])
    missing = []
    # up to the first divergence: later, a gradient grown to inf stops changing for other reasons
    first = c.first_divergence["update"] if c.first_divergence else len(c.results) - 1
    for i in range(first + 1):
        w = run.window(i)
        for m in range(w.start + 1, w.stop):
            now, before = states[m][params], states[m - 1][params]
            if before.any() and np.array_equal(now, before):
                missing.append((i, m - w.start))
    if not missing:
        return None
    update, position = missing[0]
    k = window(c)
    return Diagnosis(
        "micro-batch-missing",
        f"the accumulated gradient did not change at micro-step {position} (of {k}) of window "
        f"{update}: that micro-batch was forwarded but never backpropagated "
        f"({len(missing)} micro-step(s) in all), so the window holds {k - 1} of its {k} "
        "micro-batches",
        {
            "first_update": update,
            "position_in_window": position,
            "micro_steps_missing": len(missing),
        },
        "call backward() for every micro-batch of the window, the last one included, before "
        "optimizer.step()",
    )


def _empty_gradient(c: Comparison) -> Diagnosis | None:
    """Up to the first divergence, an update where the merged run stepped with a gradient of
    norm 0 (every element of every parameter) and the baseline did not, with no zero_grad()
    counted inside that window: none of the window's micro-batches reached `.grad`."""
    last = c.first_divergence["update"] if c.first_divergence else len(c.results) - 1
    inside = c.merged.zero_grads_inside
    for i in range(last + 1):
        merged, base = grad_norm(c, c.merged, i), grad_norm(c, c.baseline, i)
        if merged != 0.0 or not base or (inside is not None and inside[i] > 0):
            continue
        k = window(c)
        return Diagnosis(
            "micro-batch-missing",
            f"at update {i} the merged run stepped with a gradient of norm 0 in every parameter "
            f"(the baseline's: {base:.4g}): none of the window's {k} micro-batches reached the "
            "parameters' .grad: their backward ran with gradient sync off (FSDP's "
            "set_requires_gradient_sync(False), or no_sync(), around the last micro-step too), "
            "or the gradients were dropped after the last backward (set to None, or a loss "
            "detached before backward())",
            {"first_update": i, "merged_grad_norm": 0.0, "baseline_grad_norm": finite(base)},
            "let the last micro-step's backward reduce the gradients (sync on from its forward), "
            "and clear them only after optimizer.step()",
        )
    return None


def inner_steps(run: Run) -> int | None:
    """Optimizer steps taken between two micro-steps of one window (None: not recorded)."""
    if run.micro_step_counts is None:
        return None
    total = 0
    for i in range(run.updates):
        w = run.window(i)
        total += int(run.micro_step_counts[w.start + 1 : w.stop].sum())
    return total


def loss_averaging(c: Comparison) -> Diagnosis | None:
    """Only the losses disagree: the training is the same, the recorded losses are averaged
    (or logged) differently."""
    status = {check.name: check.status for check in c.checks}
    tensors_fine = all(status.get(n) != FAIL for n in ("weights", "gradients"))
    if status.get("losses") != FAIL or not tensors_fine:
        return None
    ratios = [r.merged_loss / r.base_loss for r in c.results if r.base_loss and not r.loss_ok]
    q = float(np.median(ratios)) if ratios else math.nan
    k = window(c)
    evidence = {"window_loss_ratio": finite(q), "K": k}
    if status.get("weights") is None:  # a log of losses alone (card logs: `card-loss`)
        if status.get("norms before clipping") == FAIL:  # the gradient's printed norm too
            return _scaled_norms(c, q, evidence)
        return None if len(c.merged.cards) > 1 else _scaled_losses(q, k, ratios, evidence)
    hidden = scale_behind_clip(c, q)
    if hidden is not None:
        return hidden
    if math.isfinite(q) and abs(q * k - 1) <= 0.05:
        how = (
            f"the merged window losses are {q:.4g} times the baseline's, about 1/K: the loss "
            "recorded for each micro-batch is the one already divided by K"
        )
        fix = "record each micro-batch's own unscaled loss (before dividing it by K)"
    else:
        found = _averaged_otherwise(c, q, evidence)
        if found is None:
            return None
        how, fix = found
    return Diagnosis(
        "loss-averaging",
        "only the losses disagree while the weights and gradients agree within noise: " + how,
        evidence,
        fix,
    )


def _averaged_otherwise(c: Comparison, q: float, evidence: dict) -> tuple[str, str] | None:
    """Why only the losses differ, where the ratio is not 1/K: a loss summed (or divided) over
    W ranks before it was recorded, micro-batches of unequal sizes averaged equally, or else
    recorded losses that are not the ones backpropagated; None where 16-bit losses judged
    without a reference stand within 1% of each other (rounding no fixed tolerance foresaw is
    as likely as a loss averaged otherwise)."""
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
    if uneven:
        return (
            "the window mean of the micro losses is not the batch's mean loss: the micro-"
            "batches hold different numbers of items and were averaged equally",
            "pass each micro-batch's item count (`micro(loss, items=n)`, or "
            "`micro(loss_sum=..., items=n)`) or its samples (`batch=`), so the window mean is "
            "item-weighted",
        )
    rounded = c.reference is None and c.dtype in ("float16", "bfloat16")
    if rounded and math.isfinite(q) and abs(q - 1) <= 0.01:
        return None  # 16-bit losses within 1% without a reference: rounding, as likely
    return (
        f"the merged window losses are {q:.4g} times the baseline's (median over the failing "
        "updates): the losses recorded are not the mean losses the gradients came from",
        "record each micro-batch's own unscaled mean loss (the one backpropagated, before "
        "dividing it by K), with its item count where micro-batches differ in size",
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
    k = window_of(c, scale)
    evidence.update(norm_ratio=finite(ratio), K=k)
    return Diagnosis(
        "loss-scale",
        f"the gradient norm the merged log prints is {ratio:.4g} times the baseline's at update "
        f"0 (K={k}), and its window losses {q:.4g} times: the loss the gradient comes from was "
        "scaled, not only its print (a model that ignores the num_items_in_batch it is given, "
        "or a loss not divided by K)",
        evidence,
        "scale each micro-batch's loss by its share of the window (1/K, or its items over the "
        "window's items), once; a transformers model must take num_items_in_batch (**kwargs in "
        "its forward) or set model_accepts_loss_kwargs = False",
    )


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


def weights_changed_in_window(c: Comparison) -> Diagnosis | None:
    """The weights changed inside a window, yet the optimizer stepped only between windows: an
    EMA or weight average copied in, a manual edit, a decay applied per micro-step."""
    windows = [r for r in c.results if any(k == "window" for k, _ in r.problems)]
    if not windows or inner_steps(c.merged) != 0 or _steps_differ(c):
        return None
    first = windows[0]
    text = next(t for k, t in first.problems if k == "window").rsplit(": ", 1)[0]
    return Diagnosis(
        "weights-changed-in-window",
        f"at update {first.update} {text}, yet no optimizer step happened inside any window "
        f"({len(windows)} window(s) changed): something other than the optimizer wrote to the "
        "weights between micro-steps",
        {"first_window": first.update, "windows_with_weight_changes": len(windows)},
        "change the weights only at the end of a window, after optimizer.step(): apply EMA or "
        "weight averaging (into a copy), decays and manual edits once per update",
    )


def _steps_differ(c: Comparison) -> bool:
    return any(k in ("optimizer_steps", "state_step") for r in c.results for k, _ in r.problems)
