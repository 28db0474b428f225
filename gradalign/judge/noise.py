"""What an honest run may differ by: the noise model behind the noise floor.

The floor judges each tensor by the baseline's own distance from the float64 reference. Several
honest effects escape that single measurement, and the judge measures them from the runs (the
first two elementwise, in judge/drift.py; the rest here; kinks and gains in their own modules):

- **Noise-dominated elements under an adaptive optimizer.** An element whose true gradient is
  below the gradient noise (|g_ref| within `TAU` times |g_base − g_ref|: a key bias softmax
  ignores, a LayerNorm bias, a small gradient in bfloat16) is stepped in a random direction by
  Adam, by up to about the learning rate per step, while the reference moves it little or the
  other way (a sign flip at Adam's first step costs 2·lr). The baseline draws one such walk;
  the merged run draws another. Per update, a noise-dominated element may drift by as much as
  the baseline and the reference stepped it, |Δb| + |Δref|, the other way: `drift.Drift` sums that
  per element into an allowance that widens the tensor's noise as sqrt(noise² + drift²). Under
  SGD such elements barely move (a step is lr times a tiny gradient), so little widens; a bug in
  the merged run cannot widen it (it reads only the baseline and the reference). Where neither
  stepped such an element (Rprop stops one whose sign flipped), it may drift as far as the
  tensor's elements stepped at the last update that stepped any (`noise_steps`' idle_step).
  Where both stepped an element by the same size on gradients a share apart, the sign decided
  the step (Rprop, Lion): it counts as dominated within SIGN_TAU (4) times its own gradient
  noise, since another draw may flip it (`step_rules.sign_decided`; not at the first update).
  The elements above that line carry noise too: a gradient off by a share ρ of itself moves the
  weight off by about ρ of its step, under SGD and (normalized by its own history) under Adam.
  The merged run's share of that is in the noise floor already (the baseline has the same kind);
  but the check that the reference is a rerun of the baseline (judge/compatible.py) must allow
  the baseline's own: `explained` sums, per tensor and update, ||TAU·ρ·(|Δb| + |Δref|)|| over
  those elements (measured on an H100 host's CPU: an AdamW MLP's 10-element output bias strayed
  by 2.4% of its movement, where the check allowed 1%).
- **The first step's gain.** The first update starts both runs from the same weights and an
  empty optimizer state, so there the difference of their steps is the difference of their
  gradients through the optimizer's gain at each element, measured as |b − r| / |gb − gr|
  wherever the weight difference stands above the rounding of the weight and of its step. Adam
  steps an element whose gradient is near its eps with a gain of lr·eps/(|g| + eps)², thousands
  of times that of its neighbours; the baseline drew one gradient error there, perhaps far below
  the tensor's RMS gradient noise, which the gradients are judged by. Such an element may step
  as far as that gain times the RMS in another run: `step_rules.first_step_spread` adds the part
  beyond the baseline's own draw to the drift, where it stays (the weight difference persists).
- **What the drift admitted, carried forward.** A weight the drift let the merged run set c
  times further from the baseline than the baseline's noise moves every later forward, and so
  every tensor's later gradients and weights: `carry_admitted_excess` widens each later
  update's allowance to c times the noise (the factor on top: it is the margin for one draw;
  c at most the factor squared, `carry`). The baseline's noise measures the weights' effect
  in the directions it happened to stray; the merged run strayed in others, whose effect on the
  gradients may be far larger than c says. So a later gradient may also be off by the drifted
  weights' relative distance from the reference times its norm (the same bound).
- **A loss the weights explain.** A loss is computed with the weights of the update before; where
  those passed and the loss alone failed, the loss may also differ by the first-order change
  their difference makes (`explain_loss_by_weights`).
- **A ReLU-like kink crossed in one run and not the other** is judge/kinks.py's.
- **One element's high optimizer gain** (momentum nearly cancelling) is judge/gains.py's.

Without a reference the fixed tolerances judge, and what the runs themselves show still counts:
an element whose gradient is rounding noise in both runs is judged by the gradients alone
(`drift.shared_steps`, `drift.beyond_drift`), and a kink and a loss the weights explain are
measured against the baseline (judge/kinks.py, `explain_loss_by_weights`).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from ..runs.model import Run, Tensors
from ..runs.sketches import dot, estimate, inner_bounds
from .fits import columns, gram
from .metrics import TensorDiff, module_of
from .results import UpdateResult
from .small_noise import FEW, few_draws, small_tensors_noise
from .views import Kept, Sketching, summaries

POOL = 3  # a tensor's noise is at least the RMS of its noise over updates i-POOL .. i+POOL


def around(values: np.ndarray, k: int, span: int = POOL) -> np.ndarray:
    """The entries k-span .. k+span of `values` (fewer at its ends): the updates around k."""
    return values[max(0, k - span) : k + span + 1]


def pool_noise(results: list[UpdateResult], factor: float) -> None:
    """Per tensor, raise each update's noise to the RMS of its noise over the updates around it
    (±POOL), and a small tensor's to the median noise of the update's tensors of its role and
    to their typical share of their norms (`small_noise.small_tensors_noise`): one update's
    noise, measured on a tensor of a few elements, is a poor estimate and its error ratio
    heavy-tailed (a 4-element bias in bfloat16 fails at 1.2x without this).
    Not the gradient of update 0 in a tensor of FEW elements or more (`small_noise.FEW`): both
    runs compute it from the same weights, and the noise of the updates after, grown as the
    runs part, widened it until a bfloat16 token-normalization bug there passed against the
    reference (allowed 1.0e-3 on a measured noise of 1.1e-5)."""
    for kind in ("weights", "grads"):
        series: dict[str, list[tuple[int, int, TensorDiff]]] = {}
        for u, r in enumerate(results):
            for j, d in enumerate(getattr(r, kind)):
                series.setdefault(d.name, []).append((u, j, d))
        alike = [small_tensors_noise(getattr(r, kind)) for r in results]
        for entries in series.values():
            noise = np.array([d.noise if d.noise is not None else np.nan for _, _, d in entries])
            if not np.isfinite(noise).all():
                continue
            for k, (u, j, d) in enumerate(entries):
                if kind == "grads" and u == 0 and d.size is not None and d.size >= FEW:
                    continue  # from the same weights: its own noise, measured on many elements
                near = around(noise, k)
                pooled = float(np.sqrt(np.mean(near**2)))
                if d.size is not None and d.size < FEW:
                    pooled *= few_draws(d.size * near.size)
                    if kind == "weights":  # a walk of carried errors: its widest so far
                        pooled = max(pooled, float(noise[: k + 1].max()))
                pooled = max(pooled, alike[u].get(d.name, 0.0))
                if pooled > d.noise:
                    extra = factor * (pooled - d.noise)
                    getattr(results[u], kind)[j] = dataclasses.replace(d, allowed=d.allowed + extra)


OUTLIER = 10.0  # a loss error this many times the run's median is left out of its pool


def pooled_loss_noise(own: np.ndarray) -> float:
    """The RMS of the baseline's loss errors against the reference over the run, a lower bound
    for each update's (one scalar's error is heavy-tailed), leaving out those over OUTLIER times
    their median: one update's error (a loss a reference recorded otherwise there, a hand-edited
    golden) widened every update's allowance by it, 40,000 times in a golden whose one loss was
    set 1% off. The update it is at keeps its own error. Over the finite errors: a loss not
    finite fails where it stands (`finite losses`), and it made every update's allowance NaN,
    each loss failing ("1.08e-07 > nan"); NaN where none is finite."""
    own = own[np.isfinite(own)]
    if not own.size:
        return math.nan
    kept = own[own <= OUTLIER * float(np.median(own))]
    return float(np.sqrt(np.mean(kept**2))) if kept.size else 0.0


def nearby_loss_noise(own: np.ndarray, judged: np.ndarray) -> np.ndarray:
    """Per update, the RMS of the baseline's loss errors against the reference over the judged
    updates around it (±POOL, as a tensor's noise is pooled), leaving out those over OUTLIER
    times their median there: a lower bound for each update's, where the runs part as they go
    and the run's own pool, most of it from updates before they parted, holds their errors
    as outliers. Model zoo run 267552 (transformers' Qwen2-MoE at width 2 in float32, Adam with
    eps 1e-6, K=8): the baseline's loss errors 1e-7 to 1e-6 until update 14, then 7.7e-6 to
    2.0e-4; at update 18 its own was 9.7e-6 and the merged run's 6.3e-5 failed the loss
    (1.1x), every gradient and weight within 1.7x its noise. One loss recorded otherwise (a
    hand-edited golden) stays out of its neighbours' pools (`pooled_loss_noise` of each
    window). 0 where none is judged."""
    found = np.zeros(own.shape, dtype=np.float64)
    for i in range(own.size):
        near = around(own, i)[around(judged, i)]
        near = near[np.isfinite(near)]
        if near.size:
            found[i] = pooled_loss_noise(near)
    return found


def carry_rounding(results: list[UpdateResult]) -> None:
    """Per tensor, raise each update's rounding allowance (floor·||ref||) to the largest it has
    been at any update before. A weight's error is carried from update to update, so a rounding
    made while the tensor was large stays after training shrinks it (a bias fitted towards 0);
    a gradient is a sum of per-sample terms and rounds at their size, which stays while their
    sum cancels as the tensor is fitted. Without this, a regression head's scalar bias under
    Adam failed clean runs at 1.7x: a one-ulp error made at 0.02, judged when it was 3e-3."""
    for kind in ("weights", "grads"):
        largest: dict[str, float] = {}
        for r in results:
            diffs = getattr(r, kind)
            for j, d in enumerate(diffs):
                if d.rounding is None or not math.isfinite(d.rounding):
                    continue
                before = largest.get(d.name, 0.0)
                largest[d.name] = max(before, d.rounding)
                if before > d.rounding:
                    diffs[j] = dataclasses.replace(d, allowed=d.allowed + before - d.rounding)


def carry_admitted_excess(results: list[UpdateResult], factor: float) -> None:
    """Let a difference the drift allowance admitted propagate to the updates after it.

    A weight the drift (the first step's gain, a noise-dominated walk) let the merged run set
    c times further from the baseline than the baseline's own noise feeds every later forward,
    and so the later gradients and weights of every tensor: the same dynamics that carry the
    baseline's noise forward carry c times as large a start. From the update after one that
    passed with such a difference (a tensor with a drift allowance, c > 1), every tensor's
    noise allowance is c times its noise, the factor on top (c the largest so far, at most the
    factor squared: `carry`; an update counts when its weights and gradients passed: a loss
    recorded wrongly moves no weight).
    The factor is the margin for one draw of the noise, so it is not spent on c: an Adam
    element near eps left a LayerNorm MLP's output weight 3.13x its noise at update 0, within
    the factor, and the next update's output-bias gradient stood 7.24x its noise (model zoo run
    6203). Only a tensor with a drift counts, measured before this pass widens anything, so a
    difference this pass lets through never widens the next update (no ratchet), but for the
    share of a gradient's excess that the drifted weights' distance explains (below). Attention
    under Adam, seed 45: an in-projection element near eps stepped 19x the noise at update 0,
    its weights and gradients then failed at 1.1x to 4.5x.

    c compares sizes, not directions. The baseline's weights strayed from the reference in
    some elements, and its next gradients show what that moved; the drift let the merged run
    stray in others, which may move the gradients far more. A weight perturbed by a share ρ
    of its norm moves a forward, and so the gradients, by about ρ of their size, wherever it
    lies: each later gradient may also be ρ·||g|| off (as c = ρ·||g|| / noise, capped alike),
    ρ the largest relative distance from the reference of a module with a drifted tensor.
    The excess that explains in a gradient that passes is carried like a weight's. Model zoo
    run 925 (LayerNorm MLP, Adam eps 1e-6, K=2): one element near eps put a 64x64 weight 1.74x
    its noise (2.4e-6 of its norm) away at update 0; every gradient of update 1 then stood 1.2e-6
    to 6e-6 of its norm off, where the baseline's, its noise, stood below 3e-7 (sub-ulp)."""
    carried, spread = 1.0, 0.0
    for r in results:
        admitted = [d for d in r.weights if d.noise and d.ok and _admitted(d, factor)]
        explained = carry(r, carried, factor, spread)
        if not r.problems and all(d.ok for d in (*r.weights, *r.grads)):  # the loss moves none
            carried = max([carried, *explained, *(d.error / d.noise for d in admitted)])
            spread = max(spread, _spread(r.weights, admitted))


def _admitted(d: TensorDiff, factor: float) -> bool:
    """Whether the noise model let weights stand further from the reference than the baseline's
    measured noise: a drift allowance with any excess, or a small tensor's walk (`pool_noise`:
    its widest noise so far) beyond what the factor alone allows on its noise now."""
    if d.drift:
        return d.error > d.noise
    return d.size is not None and d.size < FEW and d.error > factor * d.noise


def _spread(weights: list[TensorDiff], drifted: list[TensorDiff]) -> float:
    """The largest relative distance from the reference, ||m − ref|| / ||b||, of a module (the
    tensors whose names differ only after the last dot) that holds a drifted tensor. A module's
    tensors make its output together: a bias is measured beside its weight, so an attention key
    bias 0.6% off its own tiny norm, which moves nothing (softmax ignores it), weighs as little
    as it is against the projection (model zoo run 934: alone it widened every later gradient
    16-fold)."""
    modules = {module_of(d.name) for d in drifted}
    errors: dict[str, float] = {}
    norms: dict[str, float] = {}
    for d in weights:
        module = module_of(d.name)
        if module in modules and d.norm and math.isfinite(d.error):
            errors[module] = errors.get(module, 0.0) + d.error**2
            norms[module] = norms.get(module, 0.0) + d.norm**2
    return max((math.sqrt(errors[m] / norms[m]) for m in errors), default=0.0)


def carry(r: UpdateResult, excess: float, factor: float, spread: float = 0.0) -> list[float]:
    """Widen every tensor of update `r` to `excess` times its noise (nothing at 1 or less), at
    most `factor`² times over: an excess is measured against one tensor's own noise, which can
    be a rounding where the baseline stepped exactly as the reference (Adam's first step is
    ±lr), while the merged run's sign flipped in an element or two. Under bfloat16 autocast
    that made 3333 (model zoo run 9011, --autocast) and left every later update unchecked:
    gradients never cleared, 100% off from update 1, passed. A gradient is widened to at
    least `spread`·||g|| / noise times its noise (`carry_admitted_excess`); returns, per
    gradient beyond `excess` that way, the part of its error/noise that explains; the update's
    weights, stepped with those gradients, are widened by it too."""
    explained: list[float] = []
    for kind in ("grads", "weights"):
        diffs = getattr(r, kind)
        for j, d in enumerate(diffs):
            if d.noise is None or not math.isfinite(d.noise) or d.noise <= 0:
                continue
            c = excess if kind == "grads" else max([excess, *explained])
            if kind == "grads" and spread > 0 and d.norm:
                c = max(c, spread * d.norm / d.noise)
            c = min(c, factor * factor)
            if c > 1.0:
                diffs[j] = dataclasses.replace(d, allowed=d.allowed + factor * (c - 1.0) * d.noise)
            if kind == "grads" and c > excess and d.error > d.noise and diffs[j].ok:
                explained.append(min(c, d.error / d.noise))
    return explained


def explain_loss_by_weights(
    results: list[UpdateResult],
    merged: Run,
    ref: Run,
    factor: float,
    done: frozenset[int] = frozenset(),
    seen: Sketching | None = None,
) -> frozenset[int]:
    """Let a loss differ by what the weights it was computed with explain.

    Update u's loss is computed with the weights after update u−1. Where those weights passed
    (their difference from the reference is honest noise, drift included, or a followed
    divergence) and the loss alone failed, the loss may differ from the reference's by what
    moving between the two weights changes: along the segment d = w_m(u−1) − w_ref(u−1) the
    loss's slope runs from <g_ref(u), d> at one end to <g_m(u), d> at the other (each run's
    gradient of the same batch, at its own weights), and where the loss curves one way along it
    the change lies between the two; factor times the larger is allowed, as for the noise.
    Adamax's drift set a GPT's MLP bias 16x its noise away and moved the loss by 1.69e-5 where
    the reference's slope predicts 1.56e-5. After kinks followed over 100 updates (model zoo
    run 7313, a convolutional text model under Adagrad) 4 losses failed, off by 4.0e-5 to
    3.3e-4: 4.2 to 5.7 times the reference's slope, 0.54 to 1.28 times the merged run's. A loss
    computed wrongly (`loss-averaging`) moves the loss, not the weights, and still fails. Read
    only at such updates. `ref`: the reference, or the baseline where there is none (the loss is
    then judged against it). Returns the updates widened, with `done` (updates widened before:
    not again). `seen`: the runs are seen through sketches (judge/views.py), and each slope is
    bounded from them (`_sketched_slope`)."""
    widened = set(done)
    for u in range(1, len(results)):
        r, before = results[u], results[u - 1]
        if u in widened or r.loss_ok or not before.weights:
            continue
        if not all(d.ok for d in before.weights):
            continue
        if seen is not None:
            slopes = _sketched_slopes(merged, ref, u, seen)
        else:
            wm, wr = merged.weights(u - 1), ref.weights(u - 1)
            if wm is None or wr is None:
                continue
            grads = (ref.grads(u), merged.grads(u))
            slopes = [_slope(g, wm, wr) for g in grads if g is not None]
        finite = [slope for slope in slopes if math.isfinite(slope)]
        if finite:
            r.loss_allowed += factor * max(finite)
            widened.add(u)
    return frozenset(widened)


def _sketched_slopes(merged: Run, ref: Run, u: int, seen: Sketching) -> list[float]:
    """`_slope` for update u's gradients of the reference and the merged run, from sketches."""
    wm, wr = summaries(merged, "weights", u - 1, seen), summaries(ref, "weights", u - 1, seen)
    if wm is None or wr is None:
        return []
    grads = (summaries(run, "grads", u, seen) for run in (ref, merged))
    return [_sketched_slope(g, wm, wr) for g in grads if g is not None]


def _sketched_slope(grads: dict[str, Kept], wm: dict[str, Kept], wr: dict[str, Kept]) -> float:
    """The upper bound of `_slope` where tensors are sketched: a tensor kept whole adds its
    exact inner product, a sketched one the interval `inner_bounds` gives, within ±||g||·||d||
    (Cauchy–Schwarz, the gradient's norm exact, the step's at its upper bound)."""
    low = high = 0.0
    for name, g in grads.items():
        m, r = wm.get(name), wr.get(name)
        if m is None or r is None:
            continue
        step = m.vector - r.vector
        if g.exact and m.exact and r.exact:
            exact = dot(np.asarray(g.vector, np.float64), step)
            low, high = low + exact, high + exact
            continue
        below, above = inner_bounds(g.vector, step)
        most = g.norm * estimate(step, False).high
        low, high = low + max(below, -most), high + min(above, most)
    return max(abs(low), abs(high))


def _slope(grads: Tensors, wm: Tensors, wr: Tensors) -> float:
    """|<g, w_m − w_ref>|: the loss's slope with gradient `grads` along the step between the
    two runs' weights, read a slice at a time."""
    names = [name for name in grads if name in wm and name in wr]
    return abs(float(gram(columns((grads, wm, wr), names, lambda g, m, r: (g, m - r)), 2)[0, 1]))
