"""The noise of a small tensor (fewer than FEW elements): one update's measurement there is a
draw of a few elements, heavy-tailed, so it is bounded from above (`few_draws`) and raised to
what the update's other tensors show (`small_tensors_noise`); `noise.pool_noise` applies both."""

from __future__ import annotations

import math
import re
import statistics

import numpy as np

from .metrics import TensorDiff

FEW = 64  # a small tensor has fewer elements (the gradient of update 0 pools none: noise.py)

DRAWS_P = 0.01  # the chance that a noise measured on few draws falls below its bound
DRAWS_CAP = 4.0  # ... at most this many times the measured noise (a 0-d tensor in a 1-update run)
_DRAWS_Z = statistics.NormalDist().inv_cdf(DRAWS_P)  # the normal's DRAWS_P quantile


def few_draws(draws: int) -> float:
    """How far the true noise may stand above one measured as the RMS of `draws` elements and
    updates: the upper DRAWS_P bound of a chi-square's scale, sqrt(n / chi2_n(DRAWS_P)) by
    Wilson and Hilferty's cube, at most DRAWS_CAP. A 0-d tensor's noise over 6 updates is 6
    draws; its RMS fell to a third of what rounding gives by chance (a linear model's scalar
    offset, a few ulps of its cancelling sum in one of 8 clean runs: golden check failed it at
    1.59x). Read for tensors of fewer than FEW elements: 1.09 at 63 elements over 7 updates."""
    if draws <= 0:
        return DRAWS_CAP
    cube = 1.0 - 2.0 / (9.0 * draws) + _DRAWS_Z * math.sqrt(2.0 / (9.0 * draws))
    if cube <= 0:
        return DRAWS_CAP
    return min(DRAWS_CAP, math.sqrt(1.0 / cube**3))


ALIKE = 4  # small tensors of one role at one update that pool their noise
_NUMBERS = re.compile(r"\d+")


def small_tensors_noise(diffs: list[TensorDiff]) -> dict[str, float]:
    """Per small tensor (fewer than FEW elements) of an update, the median noise over the
    tensors of its role: those whose names differ only in their numbers (`blocks.3.gate`,
    `experts.7.bias`, a ParameterList's `b.113`), ALIKE of them at least; tensors of one role
    are drawn alike. One small tensor's noise is one draw, heavy-tailed across updates and
    tensors: 300 one-element gains and 300 biases under Adam failed clean runs at up to 2.2x,
    where the same model with two (300,) tensors passed at 0.4x. Its noise is at least that
    median (a share of each one's norm left a bias fitted towards 0 too little)."""
    roles: dict[str, list[tuple[str, float]]] = {}
    for d in diffs:
        small = d.size is not None and d.size < FEW and d.norm and d.noise is not None
        if small and math.isfinite(d.noise):  # type: ignore[arg-type]
            roles.setdefault(_NUMBERS.sub("#", d.name), []).append((d.name, d.noise))
    shares = {}
    for members in roles.values():
        if len(members) >= ALIKE:
            median = float(np.median([share for _, share in members]))
            shares.update((name, median) for name, _ in members)
    typical = _typical_relative_noise(diffs)
    for d in diffs:
        if d.size is not None and d.size < FEW and d.norm and typical:
            shares[d.name] = max(shares.get(d.name, 0.0), typical * float(d.norm))
    return shares


def _typical_relative_noise(diffs: list[TensorDiff]) -> float:
    """The median over the update's tensors (ALIKE at least) of each one's noise relative to
    its norm: what rounding makes of a tensor there, a floor for a small tensor's own draw of
    a few elements (relative to its norm: one share for tensors of every role). Cold probe's
    loop (a Conv1d with GroupNorm, NAdam, clip_grad_norm_ on each tensor alone at 0.05): the
    2-element output bias's gradient was clipped at every update around update 9 and not
    there, its noise pooled from the clipped updates' (1e-9 to 5e-9, below float32's rounding
    of a norm of 0.05), its own draw 3.7e-7 of its norm where the update's tensors drew 6e-7
    in the median; the merged run's 1.7e-6 failed at 1.03x. 0 where too few are measured."""
    relative = [
        float(d.noise) / float(d.norm)
        for d in diffs
        if d.norm and d.noise is not None and math.isfinite(d.noise) and math.isfinite(d.norm)
    ]
    return float(np.median(relative)) if len(relative) >= ALIKE else 0.0
