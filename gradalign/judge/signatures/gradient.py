"""Gradient-shape signatures: read the accumulated gradient of the first update whose gradient
fails, and name the accumulation bug its shape points to (a ratio, a direction, a dtype)."""

from __future__ import annotations

import math

import numpy as np

from ..distributed import listed
from ..fits import columns, gram
from ..metrics import fit_of
from ..results import Comparison, Diagnosis, UpdateResult
from .clipping import clip_state, pre_clip_ratio
from .common import (
    RATIO_MATCH,
    exact_of,
    finite,
    grads_of,
    noise_share,
    own_k,
    pure_scale,
    same_direction_at,
    window,
)


def window_micro_steps(c: Comparison, update: int) -> tuple[int, int]:
    """The micro-steps the merged run's window of `update` holds, and its own K (fewer in a
    short window; a merged window is judged against a baseline window of K_b micro-steps by
    K / K_b, and only the merged run's own K says whether it is short)."""
    return int(c.merged.sizes[update]), c.merged.accum_steps


def short_window(c: Comparison, update: int) -> tuple[float, str, str] | None:
    """Each micro-batch's loss divided by the merged run's K in a window of n < K micro-steps:
    the gradient n/K times the baseline's; (that ratio, how the losses were divided, the fix);
    None where the window holds its K."""
    n, k = window_micro_steps(c, update)
    if n >= k:
        return None
    return (
        n / k,
        f"divided by K={k} in a window of {n} micro-step(s) (the end of the data, a limit "
        "on the batches, or a batch size that ramps up)",
        "divide each micro-batch's loss by its own window's micro-batches or weight it by "
        "its share of the window's items; or give both runs data of a multiple of the batch "
        "of B (drop_last=True drops only a tail shorter than each loader's own batch: the "
        "merged loader's B/K keeps rows the baseline's drops) and a limit on the batches, "
        "as Lightning's limit_train_batches, a multiple of K",
    )


def loss_scale(c: Comparison, r: UpdateResult, share: float | None = None) -> Diagnosis | None:
    """`share`: the noise's share of the gradient a scale must stand beyond (default what the
    noise floor or the tolerance allows, `noise_share`)."""
    ratio, cosine = r.grad_ratio, r.grad_cosine
    if ratio is None or cosine is None:
        return None
    share = noise_share(c, r) if share is None else share
    aligned = same_direction_at(share)
    below = None if cosine >= aligned else below_clip_value(c, r)
    if below is not None:  # clip_grad_value_ turned it: read the elements it left alone
        ratio, cosine = below
    if not cosine >= aligned or not abs(ratio - 1) > share:
        return None
    k = own_k(c)
    variants = [
        *filter(None, [short_window(c, r.update)]),
        (k, f"not divided by K={k}", "divide each micro-batch's loss by K before backward()"),
        (
            1 / k,
            f"divided by K={k} once too often (twice, a mean loss; or at all, a summed loss, "
            "which the window's sum needs undivided)",
            "divide each micro-batch's mean loss by K once; a summed loss (reduction='sum', as "
            "the baseline's batch sum) is backpropagated undivided",
        ),
        (
            k + 1,
            "accumulated as `loss += loss / K` (K+1 times the right gradient)",
            "backpropagate `loss / K` alone; do not add it to the unscaled loss",
        ),
    ]
    evidence = {"update": r.update, "grad_ratio": finite(ratio), "grad_cosine": finite(cosine)}
    before = pre_clip_ratio(c, r.update)  # a clip that engaged hides the scale after it
    sizes = [(ratio, "" if below is None else " below the clip value")]
    sizes += [(before, " before clipping")] if before is not None else []
    for size, when in sizes:
        for expected, how, fix in variants:
            if abs(size / expected - 1) <= RATIO_MATCH:
                evidence["expected_ratio"] = expected
                if when == " before clipping":
                    evidence["pre_clip_ratio"] = finite(size)
                elif when:
                    evidence["below_clip_value"] = True
                stepped = (
                    f" (stepped with: {ratio:.6g} times,"
                    if when == " before clipping"
                    else " (elements both runs left below clip_grad_value_'s value; with"
                    if when
                    else " with"
                )
                what = (
                    "a loss multiplied by W (or a comm hook summing without dividing by W)"
                    if expected > 1
                    else "a loss divided by W (or a comm hook dividing by W twice)"
                )
                alike = (
                    f"; with W = K = {k}, {what} on top of DDP's mean gives the same ratio "
                    "(record with K ≠ W to tell them apart)"
                    if c.merged.world_size == k and expected in (k, 1 / k)
                    else ""
                )
                return Diagnosis(
                    "loss-scale",
                    f"the micro-batch losses were {how}: at update {r.update} the accumulated "
                    f"gradient{when} is {size:.6g} times the baseline's{stepped} cosine "
                    f"{cosine:.8f}" + (")" if when else "") + alike + _optimizer_note(c, expected),
                    evidence,
                    fix,
                )
    if not pure_scale(c, r, ratio, cosine):  # a scale matching no variant: only a pure one
        return None
    if any(not d.ok for q in c.results[: r.update] for d in q.weights):
        return None  # computed from weights the steps had already parted: no loss's scale
    clipped, after = clip_state(c, c.baseline, r.update)
    unseen = ""
    if clipped and c.merged.grad_norm_pre_clip is None:  # the merged run's clip went unseen
        evidence["baseline_clipped"] = True
        unseen = (
            f"; or the merged run clipped otherwise: the baseline's clip engaged here (norm "
            f"{c.baseline.grad_norm_pre_clip[r.update]:.4g} clipped to {after:.4g}), and a clip "
            "the merged run did by hand, by another norm or max_norm, was not recorded"
        )
    return Diagnosis(
        "loss-scale",
        f"the accumulated gradient is {ratio:.6g} times the baseline's at update {r.update} in "
        f"the same direction (cosine {cosine:.8f}): the loss is scaled by the wrong factor"
        + unseen,
        evidence,
        "scale each micro-batch's loss by 1/K (or by its share of the window's items)"
        + (
            "; clip by the norm of the whole accumulated gradient, with the baseline's max_norm "
            "(report it: Recorder.grads(pre_clip_norm=...))"
            if unseen
            else ""
        ),
    )


def below_clip_value(c: Comparison, r: UpdateResult) -> tuple[float, float] | None:
    """The fitted ratio and cosine of the merged gradient over the baseline's on the elements
    both runs left strictly below the value clip_grad_value_ clipped them to at this update
    (a wrong loss scale stands whole there; the clipped ones sit at the value in both), where
    both runs clipped by the same value and at least 16 such elements are known exactly."""
    values = [run.clip_value for run in (c.baseline, c.merged)]
    i = r.update
    if any(v is None or i >= len(v) or not math.isfinite(v[i]) for v in values):
        return None
    value = float(values[0][i])  # type: ignore[index]
    if value <= 0 or float(values[1][i]) != value:  # type: ignore[index]
        return None  # another value: clip-threshold's
    gb, gm = (exact_of(c, run, "grads", i) for run in (c.baseline, c.merged))
    if gb is None or gm is None:
        return None

    def below(b: np.ndarray, m: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        # a clipped element is the value rounded to its own dtype (float32's 0.02 < 0.02)
        kept = (np.abs(b) < b.dtype.type(value)) & (np.abs(m) < m.dtype.type(value))
        return b[kept].astype(np.float64), m[kept].astype(np.float64), np.ones(kept.sum())

    names = sorted(gb.keys() & gm.keys())
    g = gram(columns((gb, gm), names, below, widen=False), 3)  # a slice at a time
    if g[2, 2] < 16:  # the elements kept: the ones column's sum
        return None
    return fit_of(g[0, 0], g[1, 1], g[0, 1])


def loss_term_scale(c: Comparison, r: UpdateResult) -> Diagnosis | None:
    """One term of the loss scaled otherwise than the rest (a mean-reduced head never divided
    by K, a sum-reduced head divided by K though its sum over the window is the baseline's):
    the tensors that only this term reaches have gradients K, 1/K or K+1 times the baseline's
    in the same direction (each within its own noise), while the gradient as a whole is no
    such multiple (`loss_scale` reads that). Tensors that several terms reach mix the scales."""
    gb, gm = grads_of(c, c.baseline, r.update), grads_of(c, c.merged, r.update)
    k = window(c)
    if gb is None or gm is None or k < 2:
        return None
    variants = {
        k: f"not divided by K={k}",
        1 / k: f"divided by K={k} where it needs no division (or divided twice)",
        k + 1: "accumulated as `loss += loss / K`",
    }
    scaled: dict[float, list[str]] = {}
    failing = [d for d in r.grads if not d.ok and d.name in gb and d.name in gm]
    for d in failing:
        g = gram(columns((gb, gm), [d.name], lambda b, m: (b, m)), 2)  # a slice at a time
        bb, mm, bm = float(g[0, 0]), float(g[1, 1]), float(g[0, 1])
        if not (bb > 0 and mm > 0):
            return None
        ratio, cosine = bm / bb, bm / np.sqrt(bb * mm)
        share = c.tolerances.noise_factor * (d.noise or 0.0) / np.sqrt(bb)
        if cosine < same_direction_at(share):
            continue
        for expected in variants:
            if abs(ratio / expected - 1) <= RATIO_MATCH:
                scaled.setdefault(expected, []).append(d.name)
    if len(scaled) != 1:
        return None  # no tensor scaled exactly, or scaled by two different factors
    expected, names = next(iter(scaled.items()))
    if len(names) == len(gb):
        return None  # every tensor scaled alike is the whole loss: `loss_scale`'s
    return Diagnosis(
        "loss-scale",
        f"one term of the loss was {variants[expected]}: at update {r.update} the gradients of "
        f"{listed(names, 4)} are {expected:.6g} times the baseline's in the same direction, "
        "while the gradient as a whole is no multiple of it: the tensors that only this term "
        "reaches are scaled, those the other terms reach are not (or are mixed)",
        {
            "update": r.update,
            "expected_ratio": expected,
            "scaled_tensors": names,
            "grad_ratio": finite(r.grad_ratio),
            "grad_cosine": finite(r.grad_cosine),
        },
        "scale each loss term for a micro-batch as its share of the window's loss: a term that "
        "is a mean over the micro-batch by 1/K, a term that is a sum over its samples by 1 (the "
        "window's sum is the baseline's), or every term as its share of the window's items",
    )


def _optimizer_note(c: Comparison, scale: float) -> str:
    """What the merged optimizer made of the scale: nothing where every weight stayed identical
    (it steps by the gradient's sign); where it is of Adam's family, why its steps still differ
    (a loop whose author expects Adam to divide the scale out, as it does up to eps)."""
    kind = str((c.merged.optimizer_settings or {}).get("type", ""))
    weights = [d for r in c.results for d in r.weights]
    if scale != 1 and weights and all(d.max_abs == 0 for d in weights):
        return (
            f"; the weights are identical at every update: {kind or 'the optimizer'} ignores "
            "a gradient's scale (it steps by its sign, as Rprop and Lion do), so here the scale "
            "changed nothing, yet the gradient handed to it is not the training's: a clip "
            "threshold, an L2 weight_decay added to the gradient, or another optimizer would "
            "train otherwise"
        )
    if "adam" not in kind.lower() or scale == 1:
        return ""
    return (
        f"; {kind} divides a gradient's scale out of its step except for eps, which then "
        f"weighs {1 / scale:.4g} times as much beside the gradient, so the weights move nearly "
        "alike, yet not as the same training: a clip threshold, an L2 weight_decay added to "
        "the gradient and eps do not scale with the loss"
    )
