"""Signatures of bugs in how a loop accumulates: gradients carried over from the previous window,
a penalty counted K times (a loss scaler driven per micro-step, a micro-batch never
backpropagated, weights edited inside the window: window_steps.py; losses averaged otherwise:
losses.py).

Each reads a recorded fact or an exact algebraic relation between the recorded gradients, so a
match is evidence, not a guess; each returns None when its fact is absent.
"""

from __future__ import annotations

import math

import numpy as np

from ...runs.model import Tensors
from ..fits import Columns, TensorFit, columns, explained, fit, gram, per_tensor_share, tensor_fits
from ..results import Comparison, Diagnosis, UpdateResult
from .clipping import undo_clip
from .common import finite, grads_of, noise_share, weights_of, window

EXPLAINED = 0.95  # a relation must explain this share of the gradient error (1 - residual share)
# ... or, the rest within the noise, most of it: a fit of a few tenths of a percent explains
# nothing (a wide GPT's clean gradients: 0.8% "explained" by the previous gradient, the rest noise)
MOSTLY = 0.5


def _params(c: Comparison, grads: Tensors) -> list[str]:
    return [t.name for t in c.baseline.tensors if t.kind == "param" and t.name in grads]


def grad_not_cleared(c: Comparison, r: UpdateResult) -> Diagnosis | None:
    """zero_grad() never called: the merged gradient is the baseline's plus the previous window's
    merged gradient (times a constant, when the loop divides .grad every window), up to a share
    or, most of it explained, to the reference's noise (bfloat16 autocast: 94.2% explained, the
    rest noise; zoo 9013)."""
    inside = c.merged.zero_grads_inside
    if r.update == 0 or (inside is not None and inside[r.update]):
        return None  # cleared inside the window (counted): nothing was carried into it
    gb, gm, prev = (
        grads_of(c, c.baseline, r.update),
        grads_of(c, c.merged, r.update),
        grads_of(c, c.merged, r.update - 1),
    )
    if gb is None or gm is None or prev is None:
        return None
    # the difference, the carried gradient, the baseline's: a pass at a time
    source = columns((gm, gb, prev), _params(c, gb), lambda m, b, p: (m - b, p, b))
    g = gram(source, 3)
    (a,), rest = fit(source, g, (1,))
    share = explained(g[0, 0], rest)
    if _entered_apart_faintly(c, r, a):
        return None
    if a <= 0 or not _enough(c, r, g, share):
        return _clipped_carry(c, r, source, g)
    within = _within(share)
    return Diagnosis(
        "grad-not-cleared",
        f"at update {r.update} the merged gradient is the baseline's plus {a:.4g} times the "
        f"previous window's merged gradient ({share:.1%} of the difference explained{within}): "
        "gradients were carried over from one window into the next",
        {"update": r.update, "carried_fraction": a, "explained_share": share},
        _NOT_CLEARED_FIX,
    )


_NOT_CLEARED_FIX = "call optimizer.zero_grad() once per update, right after optimizer.step()"
# a carry adds the previous window's gradient whole, or times the factor a clip or the loop
# applied to .grad: a coefficient below this reads no carry where the weights already parted
FAINT_CARRY = 0.01


def _entered_apart_faintly(c: Comparison, r: UpdateResult, a: float) -> bool:
    """Whether the runs entered update r with weights that failed their check and the carry
    fit reads a coefficient below FAINT_CARRY. Weights δw apart move the gradient by about
    H·δw, and δw follows the steps before, so the previous gradient explains part of that
    difference without any carry: a hand-written LAMB without a reference, whose trust ratio
    rounding noise moved at update 0 (judge/coupled_steps.py), was `grad-not-cleared` at update
    1 at 1.0e-4 times the previous gradient, 66.6% of the difference explained."""
    if a >= FAINT_CARRY or r.update == 0:
        return False
    before = next((x for x in c.results if x.update == r.update - 1), None)
    return before is not None and any(not d.ok for d in before.weights)


def _enough(c: Comparison, r: UpdateResult, g: np.ndarray, share: float) -> bool:
    """Whether a fit explains the gradient error: `EXPLAINED` of it, or `MOSTLY`, the rest
    within the noise (against a reference; without one, within what the gradient check
    allows: the rest alone would pass). `g`: the Gram matrix of the difference (column 0) and
    the baseline's gradient (column 2)."""
    if share >= EXPLAINED:
        return True
    rest = math.sqrt(g[0, 0]) * (1.0 - share)
    return share >= MOSTLY and rest <= noise_share(c, r) * math.sqrt(g[2, 2])


def _clipped_carry(
    c: Comparison, r: UpdateResult, source: Columns, g: np.ndarray
) -> Diagnosis | None:
    """`grad_not_cleared` where a clip scaled the gradients the runs stepped with: the merged
    one is c·(carried + g) and the baseline's c'·g, so the difference is a·carried + b·base
    (a = c, b = c/c' − 1), which neither explains alone (`--clip 1.0`: 14 of 30 zoo runs
    without zero_grad() were `unexplained`). Named where both together explain it (`_enough`:
    a clip that binds hard keeps the carry a few percent of the gradient, and bfloat16's noise
    then stands beside it: 92% explained, the rest a sixth of the noise, zoo run 162015), the
    carried gradient's part is positive, and the baseline's gradient alone does not by the same
    measure (a loss scaled by K under a clip is a multiple of it; a loss not divided by K under
    bfloat16, the gradient 3.96 times the baseline's, 93% of its error explained by that alone,
    the rest within noise, was read as a carry of 0.028 times the previous gradient, zoo run
    182511)."""
    _, rest_alone = fit(source, g, (2,))
    (a, b), rest = fit(source, g, (1, 2))
    share, alone = explained(g[0, 0], rest), explained(g[0, 0], rest_alone)
    if a <= 0 or _enough(c, r, g, alone) or not _enough(c, r, g, share):
        return None
    calls = [run.clip_calls for run in (c.baseline, c.merged) if run.clip_calls is not None]
    clipped = any(r.update < len(n) and n[r.update] > 0 for n in calls)
    scaled = "a clip scaled" if clipped else "no clip was recorded, yet the loop scaled"
    within = _within(share)
    return Diagnosis(
        "grad-not-cleared",
        f"at update {r.update} the merged gradient is {1 + b:.4g} times the baseline's plus "
        f"{a:.4g} times the previous window's merged gradient ({share:.1%} of the difference "
        f"explained{within}; {scaled} each run's gradient by its own factor): gradients were "
        "carried over from one window into the next",
        {
            "update": r.update,
            "carried_fraction": a,
            "baseline_factor": 1 + b,
            "explained_share": share,
        },
        _NOT_CLEARED_FIX,
    )


def penalty_not_scaled(c: Comparison, r: UpdateResult) -> Diagnosis | None:
    """A weight penalty added to every micro loss without 1/K: the gradient error is exactly
    proportional to the weights the window started from (per tensor, or zero), for an L2
    penalty c·||w||², or to their signs, for an L1 penalty λ·||w||₁ (a cold probe's loop: its
    L1 penalty at every micro-step was `unexplained` on even micro-batches, `token-
    normalization` with a false claim and fix on uneven ones). Where a clip engaged, each run's
    gradient is read as it was before its clip (`undo_clip`: its norm before over its norm
    after): a clip scales each run's whole gradient by its own factor, so the stepped
    gradients' difference is a multiple of the weights plus one of the baseline's gradient
    (model zoo run 286002, a convolutional text model under RMSprop, K=8, clipped at 1.0: 100%
    of the difference so, 1% by the weights alone, `unexplained`)."""
    return _penalty(c, r, L2) or _penalty(c, r, L1)


L2, L1 = "weights", "weights' signs"  # what the gradient error is a multiple of
_BASIS = {L2: lambda w: w, L1: np.sign}


def _penalty(c: Comparison, r: UpdateResult, form: str) -> Diagnosis | None:
    gb, gm = grads_of(c, c.baseline, r.update), grads_of(c, c.merged, r.update)
    start = weights_of(c, c.baseline, None if r.update == 0 else r.update - 1)
    if gb is None or gm is None or start is None:
        return None
    # one number is a multiple of any other: no evidence
    names = [name for name in _params(c, gb) if np.size(start[name]) > 1]
    ub, um = (undo_clip(c, run, r.update) for run in (c.baseline, c.merged))

    def before_clips(m: np.ndarray, b: np.ndarray, w: np.ndarray) -> tuple:
        """The difference, the basis of the weights the window started from, the baseline's
        gradient, each gradient as it was before its run's clip."""
        w = _BASIS[form](w)
        return (m * um - b * ub, w, b * ub) if (um, ub) != (1.0, 1.0) else (m - b, w, b)

    fits = tensor_fits(((n, columns((gm, gb, start), [n], before_clips)) for n in names), 3)
    share, fitted = per_tensor_share(fits), {n: f.a for n, f in fits.items()}
    coefficients = [a for a in fitted.values() if abs(a) > 0]
    if not coefficients:
        return None
    surest = None  # the coefficient read in units of the noise, where the fit needed them
    if not _enough(c, r, sum(f.gram for f in fits.values()), share):
        share, surest = _share_in_noise(r, fits)
        if share < MOSTLY:
            return None
    k = window(c)
    if max(coefficients) <= 0:  # short of the baseline's in every tensor: counted too little
        return _penalty_short(r, k, -min(coefficients), share, fitted, form)
    if surest is not None and surest <= 0:  # short, as read in units of the noise
        return _penalty_short(r, k, -surest, share, fitted, form)
    a = max(coefficients) if surest is None else surest
    measure = "" if surest is None else " in units of each gradient's noise"
    if (um, ub) != (1.0, 1.0):
        measure += ", each run's gradient as it was before its clip"
    if form == L2:
        c2 = a / (2 * (k - 1)) if k > 1 else a  # the extra K-1 penalties' gradient: 2·c·(K-1)·w
        which = "a weight penalty"
        size = (
            f"its coefficient is about {c2:.4g} written as c·‖w‖² (λ = {2 * c2:.4g} written as "
            "λ/2·‖w‖²)"
        )
        implied = {"implied_l2": finite(c2) if k > 1 else None}
    else:
        lam = a / (k - 1) if k > 1 else a  # the extra K-1 penalties' gradient: λ·(K-1)·sign(w)
        which = "an L1 penalty λ·‖w‖₁"
        size = f"λ is about {lam:.4g}"
        implied = {"implied_l1": finite(lam) if k > 1 else None}
    return Diagnosis(
        "penalty-not-scaled",
        f"at update {r.update} the merged gradient exceeds the baseline's by {a:.4g} times the "
        f"{form} ({share:.1%} of the difference explained{measure}{_within(share)}): {which} "
        f"was added to each of the K={k} micro losses in full, i.e. counted K times; {size}",
        {
            "update": r.update,
            _EVIDENCE[form]: {n: finite(v) for n, v in fitted.items()},
            "explained_share": share,
            **implied,
        },
        "add the penalty once per window: divide it by K in each micro loss (or add it to the "
        "accumulated gradient once, or use the optimizer's weight_decay)",
    )


_EVIDENCE = {
    L2: "gradient_minus_baseline_over_weights",
    L1: "gradient_minus_baseline_over_weight_signs",
}


def _share_in_noise(r: UpdateResult, fits: dict[str, TensorFit]) -> tuple[float, float]:
    """The share of the difference the fitted multiples explain, each tensor's measured in units
    of its gradient's noise against the reference, where that leaves every gradient within what
    its check allows (else 0: no reference, or a rest beyond a check), and the multiple read in
    those units (each tensor's weighted by its basis's energy over its noise). Under bfloat16 a
    penalty's share of a tensor whose weights are small beside its gradient's noise is lost in
    it, and such tensors hold most of the difference's energy: model zoo run 184515 (a ResNet
    under Adagrad, a penalty counted K times, K=2) had 29% of its difference explained
    together, 83% in units of the noise, every tensor's rest within 0.9 times its noise."""
    diffs = {d.name: d for d in r.grads}
    residual, total, weighed, weights = 0.0, 0.0, 0.0, 0.0
    for name, f in fits.items():
        d = diffs.get(name)
        if d is None or not d.noise or not math.isfinite(d.noise):
            return 0.0, 0.0
        rest = math.sqrt(f.rest)
        if rest > d.allowed:
            return 0.0, 0.0
        residual += (rest / d.noise) ** 2
        total += float(f.gram[0, 0]) / d.noise**2
        energy = float(f.gram[1, 1]) / d.noise**2
        weighed += f.a * energy
        weights += energy
    if total <= 0 or weights <= 0:
        return 0.0, 0.0
    return 1.0 - math.sqrt(residual / total), weighed / weights


def _within(share: float) -> str:
    return "" if share >= EXPLAINED else ", the rest within the noise"


def _penalty_short(
    r: UpdateResult, k: int, a: float, share: float, fitted: dict[str, float], form: str = L2
) -> Diagnosis:
    """`penalty_not_scaled` where the merged gradient falls short by a multiple of the weights
    (or their signs): the penalty divided by K twice (inside each micro loss, then with it), or
    left out of some micro-steps."""
    which = "a weight penalty" if form == L2 else "an L1 penalty"
    return Diagnosis(
        "penalty-not-scaled",
        f"at update {r.update} the merged gradient falls short of the baseline's by {a:.4g} "
        f"times the {form} ({share:.1%} of the difference explained): {which} was "
        f"counted less than once per window across the K={k} micro losses, divided by K twice "
        "(inside each micro loss and again with it) or added at some micro-steps only",
        {
            "update": r.update,
            _EVIDENCE[form]: {n: finite(v) for n, v in fitted.items()},
            "explained_share": share,
            "implied_l2" if form == L2 else "implied_l1": None,
        },
        "add the penalty once per window: divide it by K once in each micro loss (or add it to "
        "the accumulated gradient once, or use the optimizer's weight_decay)",
    )
