"""Weights decayed otherwise than the baseline's: the merged run's step shrank (or spared) the
weights by another factor while its gradient agreed. Decoupled weight decay applied once per
micro-step (a loop's own `p.mul_(1 - lr·wd)` after the step, K times over), a weight-decay
schedule stepped per micro-step, a decay skipped at some updates, or another weight_decay where
the optimizer's settings were not recorded: each moves every decayed weight by a multiple of
itself, which no gradient and no learning rate does."""

from __future__ import annotations

import math

import numpy as np

from ...runs.model import Tensors
from ..distributed import listed
from ..fits import columns, per_tensor_share, tensor_fits
from ..results import Comparison, Diagnosis, UpdateResult
from .accumulation import EXPLAINED
from .common import finite, weights_of, window
from .optimizer import optimizer_settings


def _first_in_step(c: Comparison) -> UpdateResult | None:
    """The first update whose weights fail where no gradient up to it did: the divergence
    entered in the optimizer's step, not in what it was given."""
    for r in c.results:
        if any(not d.ok for d in r.grads):
            return None
        if any(not d.ok for d in r.weights):
            return r
    return None


def weights_decayed(c: Comparison) -> Diagnosis | None:
    """Per parameter, the part of the weight difference this update made, (w_m − w_b)(u) −
    (w_m − w_b)(u−1), is a multiple a of the baseline's weights before the step (a decay inside
    it) or after it (a decay after it), over EXPLAINED of the difference (tensors the decay
    spares fit with a = 0); one-element tensors say nothing (any number is a multiple of any
    other). Where the recorded settings differ in weight_decay, those name it."""
    r = _first_in_step(c)
    if r is None or _named_by_settings(c) or any(key == "lr" for key, _ in r.problems):
        return None  # a step at another lr moves every weight otherwise (`lr-schedule`)
    u = r.update
    before = None if u == 0 else u - 1
    wb, wm = weights_of(c, c.baseline, u), weights_of(c, c.merged, u)
    sb, sm = weights_of(c, c.baseline, before), weights_of(c, c.merged, before)
    if wb is None or wm is None or sb is None or sm is None:
        return None
    names = [
        t.name
        for t in c.baseline.tensors
        if t.kind == "param" and t.name in wb and t.name in wm and math.prod(t.shape) > 1
    ]
    # a decay inside the step (AdamW's) scales the weights it began from, one after the step
    # (a loop's own) the weights it left: whichever explains more
    share, fitted, start = max(
        ((*_fit(names, wm, wb, sm, sb, basis), basis) for basis in (sb, wb)),
        key=lambda fit: fit[0],
    )
    if share < EXPLAINED:
        return None
    decayed = {n: a for n, a in fitted.items() if abs(a) * _size(start[n]) > _allowed(r, n)}
    if not decayed:
        return None
    a = max(decayed.values(), key=abs)
    how = (
        f"shrank the weights by a further {-a:.3g} of themselves"
        if a < 0
        else f"shrank the weights by {a:.3g} of themselves less"
    )
    k = window(c)
    per_micro = (
        f"; K−1 = {k - 1} extra decays of about {-a / (k - 1):.3g} each, as a decay applied "
        "at every micro-step would give"
        if a < 0 and k > 1
        else ""
    )
    return Diagnosis(
        "weights-decayed",
        f"at update {u} the gradients agree, but the merged run's step {how} than the "
        f"baseline's ({listed(sorted(decayed), 3)}; {share:.1%} of the weights' difference is a "
        f"multiple of the weights){per_micro}: weight decay was applied otherwise than once per "
        "update",
        {
            "update": u,
            "weight_change_over_weights": {n: finite(v) for n, v in fitted.items()},
            "explained_share": share,
            "extra_decay_per_micro_step": finite(-a / (k - 1)) if a < 0 and k > 1 else None,
        },
        "apply weight decay once per optimizer step (the optimizer's weight_decay, or one "
        "decay after step()), never per micro-batch; step a weight-decay schedule once per "
        "update, as the learning rate's",
    )


def _fit(
    names: list[str], wm: Tensors, wb: Tensors, sm: Tensors, sb: Tensors, basis: Tensors
) -> tuple[float, dict[str, float]]:
    """The share of this update's weight difference that is per tensor a multiple of `basis`,
    and each tensor's multiple."""
    fits = tensor_fits(((n, columns((wm, wb, sm, sb, basis), [n], _step_gap)) for n in names), 2)
    return per_tensor_share(fits), {n: f.a for n, f in fits.items()}


def _step_gap(wm, wb, sm, sb, basis) -> tuple[np.ndarray, np.ndarray]:
    """A slice of the part of the weight difference this update made, (w_m − w_b)(u) −
    (w_m − w_b)(u−1), and of the basis it is fitted on."""
    return (wm - wb) - (sm - sb), basis


def _named_by_settings(c: Comparison) -> bool:
    """Whether the optimizers' recorded settings differ in weight_decay: named there."""
    settings = optimizer_settings(c)
    differences = settings.evidence["differences"] if settings is not None else []
    return any(d["setting"] == "weight_decay" for d in differences)


def _size(values: np.ndarray) -> float:
    return float(np.linalg.norm(np.asarray(values, np.float64)))


def _allowed(r: UpdateResult, name: str) -> float:
    """What the weight check allowed a tensor at this update: a decay below it is no evidence."""
    return next((d.allowed for d in r.weights if d.name == name), 0.0)
