"""What an honest run may differ by: the noise model behind the noise floor.

The floor judges each tensor by the baseline's own distance from the float64 reference. Several
honest effects escape that single measurement, and this module measures them from the runs:

- **Noise-dominated elements under an adaptive optimizer.** An element whose true gradient is
  below the gradient noise (|g_ref| within `TAU` times |g_base − g_ref|: a key bias softmax
  ignores, a LayerNorm bias, a small gradient in bfloat16) is stepped in a random direction by
  Adam, by up to about the learning rate per step, while the reference moves it little or the
  other way (a sign flip at Adam's first step costs 2·lr). The baseline draws one such walk;
  the merged run draws another. Per update, a noise-dominated element may drift by as much as
  the baseline and the reference stepped it, |Δb| + |Δref|, the other way: `Drift` sums that
  per element into an allowance that widens the tensor's noise as sqrt(noise² + drift²). Under
  SGD such elements barely move (a step is lr times a tiny gradient), so little widens; a bug in
  the merged run cannot widen it (it reads only the baseline and the reference).
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
  as far as that gain times the RMS in another run: `first_step_spread` adds the part beyond
  the baseline's own draw to the drift, where it stays (the weight difference persists).
- **What the drift admitted, carried forward.** A weight the drift let the merged run set c
  times further from the baseline than the baseline's noise moves every later forward, and so
  every tensor's later gradients and weights: `carry_admitted_excess` widens each later
  update's allowance to c times the noise (the factor on top: it is the margin for one draw;
  c at most the factor squared, `carry`).
- **A loss the weights explain.** A loss is computed with the weights of the update before; where
  those passed and the loss alone failed, the loss may also differ by the first-order change
  their difference makes (`explain_loss_by_weights`).
- **A ReLU-like kink crossed in one run and not the other** is judge/kinks.py's.
- **One element's high optimizer gain** (momentum nearly cancelling) is judge/gains.py's.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from ..runs.model import Run, Tensors
from ..runs.sketches import dot
from .metrics import TensorDiff
from .results import UpdateResult

TAU = 2.0  # |g_ref| within TAU times the gradient noise (element's, or the tensor's RMS)
POOL = 3  # a tensor's noise is at least the RMS of its noise over updates i-POOL .. i+POOL
MANTISSA = {"float64": 52, "float32": 23, "float16": 10, "bfloat16": 7}  # stored bits
STEP_ROUNDINGS = 8  # a step computed in the run's dtype errs by up to this many of its units
ABOVE_ROUNDING = 4  # a weight difference this many roundings wide is the gradient's


def noise_steps(
    gb: np.ndarray,
    gr: np.ndarray,
    rms: float,
    b: np.ndarray,
    pb: np.ndarray,
    r: np.ndarray,
    pr: np.ndarray,
    first_bits: int | None = None,
) -> tuple[np.ndarray, float]:
    """For aligned float64 slices of the gradients (gb, gr), the weights after (b, r) and before
    (pb, pr) an update, and the tensor's RMS gradient noise: the steps |Δb| + |Δr| of the
    noise-dominated elements (`first_step_spread` elsewhere at the first update, whose
    weights have `first_bits` stored mantissa bits; 0 elsewhere), and Σ(TAU·ρ·step)² over the
    other elements, ρ = max(|gb − gr|, rms) / |gr| (each below 1/TAU there)."""
    spread = (
        None if first_bits is None else first_step_spread(gb, gr, rms, b, pb, r, pr, first_bits)
    )
    noise = _gradient_noise(gb, gr, rms)
    size = np.abs(gr)
    dominated = size <= noise
    steps = _both_steps(b, pb, r, pr)
    with np.errstate(divide="ignore", invalid="ignore"):  # inf and 0/0 only where dominated
        np.divide(noise, size, out=noise)
        noise *= steps
    noise[dominated] = 0.0
    np.multiply(steps, dominated, out=steps)
    if spread is not None:
        np.add(steps, spread, out=steps, where=~dominated)
    return steps, dot(noise, noise)


def shared_steps(
    gb: np.ndarray,
    gm: np.ndarray,
    rms: float,
    b: np.ndarray,
    pb: np.ndarray,
    m: np.ndarray,
    pm: np.ndarray,
) -> np.ndarray:
    """Without a reference, per element of aligned float64 slices of both runs' gradients, and
    weights after (b, m) and before (pb, pm) an update: the share of their steps |Δb| + |Δm|
    that the gradient's noise explains, min(1, TAU·ρ), ρ = max(|gb − gm|, rms) / max(|gb|,
    |gm|). All of them where the gradient is noise (an adaptive optimizer steps such an element
    where the noise points); elsewhere a gradient off by a share ρ of itself moves its step by
    at most that share (SGD's step is proportional to it; Adam's first step lr·g/(|g| + eps)
    changes by less, near its eps too)."""
    noise = _gradient_noise(gb, gm, rms)
    size = np.abs(gb)
    np.maximum(size, np.abs(gm), out=size)
    share = np.ones_like(size)
    np.divide(noise, size, out=share, where=size > noise)  # below 1 above the noise alone
    steps = _both_steps(b, pb, m, pm)
    steps *= share
    return steps


def _gradient_noise(ga: np.ndarray, gb: np.ndarray, rms: float) -> np.ndarray:
    """TAU·max(|ga − gb|, rms) per element (= max(TAU·x, TAU·rms) exactly)."""
    noise = np.subtract(ga, gb)
    np.abs(noise, out=noise)
    np.maximum(noise, rms, out=noise)
    noise *= TAU
    return noise


def _both_steps(a: np.ndarray, pa: np.ndarray, b: np.ndarray, pb: np.ndarray) -> np.ndarray:
    """|a − pa| + |b − pb|: two runs' steps at each element."""
    steps = np.subtract(a, pa)
    np.abs(steps, out=steps)
    other = np.subtract(b, pb)
    np.abs(other, out=other)
    steps += other
    return steps


def first_step_spread(
    gb: np.ndarray,
    gr: np.ndarray,
    rms: float,
    b: np.ndarray,
    pb: np.ndarray,
    r: np.ndarray,
    pr: np.ndarray,
    bits: int,
) -> np.ndarray:
    """At the first update (pb == pr): per element, how much further than the baseline another
    run may step on a gradient error of the tensor's RMS, |b − r|·(rms/|gb − gr| − 1), where
    the baseline's error |gb − gr| was drawn below the RMS and its weight difference |b − r|
    stands ABOVE_ROUNDING times above the rounding of its weight and step (in a dtype of `bits`
    mantissa bits): there the gain |b − r| / |gb − gr| is the optimizer's. 0 elsewhere."""
    dg = np.abs(gb - gr)
    dw = np.abs(b - r)
    rounding = _ulp(b, bits) + STEP_ROUNDINGS * _ulp(b - pb, bits)
    use = (pb == pr) & (dg > 0) & (dg < rms) & (dw > ABOVE_ROUNDING * rounding)
    out = np.zeros_like(dw)
    out[use] = dw[use] * (rms / dg[use] - 1.0)
    return out


def _ulp(x: np.ndarray, bits: int) -> np.ndarray:
    """The spacing of numbers of `bits` stored mantissa bits around each x (at 0: that of 1)."""
    _, exponent = np.frexp(np.where(x == 0, 1.0, x))
    return np.ldexp(1.0, exponent - 1 - bits)


def stored_bits(run: Run) -> dict[str, int]:
    """Each recorded tensor's stored mantissa bits (where its dtype is a float dtype)."""
    return {t.name: MANTISSA[t.dtype] for t in run.tensors if t.dtype in MANTISSA}


class Drift:
    """Per tensor, how far noise-dominated elements may have drifted under adaptive steps, and
    how far the baseline's noise explains that it strayed from the reference elsewhere.

    Without a reference the merged run stands in for it (`against_merged`): each element may
    drift by the share of both runs' steps its gradient's noise explains (`shared_steps`: all
    of them where neither run's gradient stands above their difference), counted only at
    updates where that tensor's gradients passed their check, so a merged gradient that is
    wrong as a whole widens nothing. An element's weights then count only beyond its own drift
    (`beyond_drift`): the allowance is the element's, never a share of the tensor's."""

    def __init__(
        self, starts: Tensors, bits: dict[str, int] | None = None, against_merged: bool = False
    ) -> None:
        """`bits`: each tensor's stored mantissa bits in the baseline (`stored_bits`)."""
        self.against_merged = against_merged
        self.bits = {} if against_merged else bits or {}
        self.prev_b = {n: np.asarray(v, dtype=np.float64) for n, v in starts.items()}
        self.prev_r = dict(self.prev_b)
        self.drift: dict[str, np.ndarray] = {}
        self.explained: dict[str, float] = {}

    def advance(
        self,
        gb: Tensors | None,
        gr: Tensors | None,
        wb: Tensors,
        wr: Tensors,
        first: bool = False,
        passed: set[str] | None = None,
    ) -> None:
        """Take update i's steps (weights after i against after i−1) and gradients (`first`:
        i is update 0). `gr`, `wr`: the reference's, or the merged run's (`against_merged`),
        whose steps count only in the tensors `passed` names (their gradients passed)."""
        for name, b in wb.items():
            if name not in wr or name not in self.prev_b:
                continue
            b64, r64 = np.asarray(b, dtype=np.float64), np.asarray(wr[name], dtype=np.float64)
            counted = passed is None or name in passed
            if counted and gb is not None and gr is not None and name in gb and name in gr:
                bits = self.bits.get(name) if first else None
                self._widen(name, gb[name], gr[name], b64, r64, bits)
            self.prev_b[name], self.prev_r[name] = b64, r64

    def _widen(
        self,
        name: str,
        gb: np.ndarray,
        gr: np.ndarray,
        b: np.ndarray,
        r: np.ndarray,
        first_bits: int | None,
    ) -> None:
        g_ref = np.asarray(gr, dtype=np.float64).ravel()
        g_base = np.asarray(gb, dtype=np.float64).ravel()
        noise = np.abs(g_base - g_ref)
        if not (np.isfinite(noise).all() and np.isfinite(b).all() and np.isfinite(r).all()):
            return
        # one element's noise is one draw: the tensor's RMS noise bounds it from below
        rms = math.sqrt(float(np.mean(noise**2))) if noise.size else 0.0
        prev_b, prev_r = self.prev_b[name].ravel(), self.prev_r[name].ravel()
        if self.against_merged:
            steps = shared_steps(g_base, g_ref, rms, b.ravel(), prev_b, r.ravel(), prev_r)
        else:
            steps, explained = noise_steps(
                g_base, g_ref, rms, b.ravel(), prev_b, r.ravel(), prev_r, first_bits
            )
            self.explained[name] = self.explained.get(name, 0.0) + math.sqrt(explained)
        if not steps.any():
            return
        # the merged run may step such an element as far as either run did, the other way
        drift = self.drift.setdefault(name, np.zeros(b.size))
        drift += steps

    def allowance(self, name: str) -> float:
        """||drift|| of a tensor: what its noise-dominated elements may add to its error."""
        drift = self.drift.get(name)
        return 0.0 if drift is None else float(np.linalg.norm(drift))

    def strayed(self, name: str) -> float:
        """How far the baseline may stray from the reference on its noise: the drift, and what
        the other elements' noise explains (`noise_steps`)."""
        return self.allowance(name) + self.explained.get(name, 0.0)


def widened(d: TensorDiff, drift: float, factor: float) -> TensorDiff:
    """A weight's judgement with the drift allowance folded into its noise."""
    if drift <= 0 or d.noise is None or not math.isfinite(d.noise):
        return d
    extra = factor * (math.hypot(d.noise, drift) - d.noise)
    return dataclasses.replace(d, allowed=d.allowed + extra, drift=drift)


def beyond_drift(d: TensorDiff, excess: float, drift: float) -> TensorDiff:
    """A weight judged by the fixed tolerances (no reference) whose noise-dominated elements are
    judged by the gradients alone: each element counts only by how far it stands beyond its own
    drift (the steps both runs took while it was dominated), `excess` = ||max(|m − b| − drift,
    0)||, so the drift of one element never covers another's error."""
    if drift <= 0 or not math.isfinite(d.error):
        return d
    return dataclasses.replace(d, error=excess, drift=drift)


def excess_over(base: np.ndarray, merged: np.ndarray, drift: np.ndarray) -> float:
    """||max(|m − b| − drift, 0)|| over aligned flat float64 arrays (`beyond_drift`)."""
    gap = np.abs(merged - base)
    gap -= drift
    np.maximum(gap, 0.0, out=gap)
    return math.sqrt(dot(gap, gap))


def pool_noise(results: list[UpdateResult], factor: float) -> None:
    """Per tensor, raise each update's noise to the RMS of its noise over the updates around it
    (±POOL): one update's noise, measured on a tensor of a few elements, is a poor estimate and
    its error ratio heavy-tailed (a 4-element bias in bfloat16 fails at 1.2x without this)."""
    for kind in ("weights", "grads"):
        series: dict[str, list[tuple[int, int, TensorDiff]]] = {}
        for u, r in enumerate(results):
            for j, d in enumerate(getattr(r, kind)):
                series.setdefault(d.name, []).append((u, j, d))
        for entries in series.values():
            noise = np.array([d.noise if d.noise is not None else np.nan for _, _, d in entries])
            if not np.isfinite(noise).all():
                continue
            for k, (u, j, d) in enumerate(entries):
                near = noise[max(0, k - POOL) : k + POOL + 1]
                pooled = float(np.sqrt(np.mean(near**2)))
                if pooled > d.noise:
                    extra = factor * (pooled - d.noise)
                    getattr(results[u], kind)[j] = dataclasses.replace(d, allowed=d.allowed + extra)


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
    difference this pass lets through never widens the next update (no ratchet). Attention
    under Adam, seed 45: an in-projection element near eps stepped 19x the noise at update 0,
    its weights and gradients then failed at 1.1x to 4.5x."""
    carried = 1.0
    for r in results:
        admitted = [
            d.error / d.noise
            for d in r.weights
            if d.drift and d.noise and d.ok and d.error > d.noise
        ]
        carry(r, carried, factor)
        if not r.problems and all(d.ok for d in (*r.weights, *r.grads)):  # the loss moves none
            carried = max([carried, *admitted])


def carry(r: UpdateResult, excess: float, factor: float) -> None:
    """Widen every tensor of update `r` to `excess` times its noise (nothing at 1 or less), at
    most `factor`² times over: an excess is measured against one tensor's own noise, which can
    be a rounding where the baseline stepped exactly as the reference (Adam's first step is
    ±lr), while the merged run's sign flipped in an element or two. Under bfloat16 autocast
    that made 3333 (model zoo run 9011, --autocast) and left every later update unchecked:
    gradients never cleared, 100% off from update 1, passed."""
    excess = min(excess, factor * factor)
    if excess <= 1.0:
        return
    for kind in ("weights", "grads"):
        diffs = getattr(r, kind)
        for j, d in enumerate(diffs):
            if d.noise is not None and math.isfinite(d.noise) and d.noise > 0:
                extra = factor * (excess - 1.0) * d.noise
                diffs[j] = dataclasses.replace(d, allowed=d.allowed + extra)


def explain_loss_by_weights(
    results: list[UpdateResult], merged: Run, ref: Run, factor: float
) -> None:
    """Let a loss differ by what the weights it was computed with explain.

    Update u's loss is computed with the weights after update u−1. Where those weights passed
    (their difference from the reference is honest noise, drift included) and the loss alone
    failed, the loss may differ from the reference's by the first-order change those weights
    make, |<g_ref(u), w_m(u−1) − w_ref(u−1)>| (factor times it, as the noise): Adamax's drift
    set a GPT's MLP bias 16x its noise away and moved the loss by 1.69e-5 where this predicts
    1.56e-5. A loss computed wrongly (`loss-averaging`) moves the loss, not the weights, and
    still fails. Read only at such updates, and only where both runs kept full weights."""
    for u in range(1, len(results)):
        r, before = results[u], results[u - 1]
        if r.loss_ok or not before.weights or not all(d.ok for d in before.weights):
            continue
        gr, wm, wr = ref.grads(u), merged.weights(u - 1), ref.weights(u - 1)
        if gr is None or wm is None or wr is None:
            continue
        change = 0.0
        for name, g in gr.items():
            if name in wm and name in wr:
                step = np.asarray(wm[name], dtype=np.float64) - np.asarray(wr[name], np.float64)
                change += float(np.dot(np.asarray(g, dtype=np.float64).ravel(), step.ravel()))
        if math.isfinite(change):
            r.loss_allowed += factor * abs(change)
