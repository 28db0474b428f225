"""The merged gradient's size by its norm over the baseline's: as stepped with, before
clipping (a clip hides a wrong scale in the gradient stepped with; the norms before it keep
it). The fitted ratio shrinks with the angle between the gradients, the norm does not, so
the signatures that read a scale beside a reweighting read both."""

from __future__ import annotations

import math

from ..results import Comparison, UpdateResult
from .clipping import clip_state, unclipped
from .common import finite, grad_norm


def stepped_norm_ratio(c: Comparison, r: UpdateResult) -> float | None:
    """The norm of the merged gradient stepped with (after any clip) over the baseline's at
    the update; times `unclipped`, their norms' ratio before clipping."""
    i = r.update
    (_, norm_b), (_, norm_m) = (clip_state(c, run, i) for run in (c.baseline, c.merged))
    if norm_b is None:  # no clip's norm recorded: clip_state read no gradient
        norm_b = grad_norm(c, c.baseline, i)
    if norm_m is None:
        norm_m = grad_norm(c, c.merged, i)
    return norm_m / norm_b if norm_m is not None and norm_b else None


def norm_before_clip(c: Comparison, r: UpdateResult, stepped: float | None = None) -> float | None:
    """The merged gradient's norm over the baseline's, before clipping (the stepped gradients'
    norms, the recorded clips undone); `stepped`: `stepped_norm_ratio`'s, where read already."""
    stepped = stepped_norm_ratio(c, r) if stepped is None else stepped
    return None if stepped is None or not stepped > 0 else stepped * unclipped(c, r)


def norm_ratio(c: Comparison, update: int) -> float | None:
    """The merged gradient's norm over the baseline's at an update: before clipping where both
    runs recorded it, else of the gradients stepped with."""
    pre_b, pre_m = c.baseline.grad_norm_pre_clip, c.merged.grad_norm_pre_clip
    if pre_b is not None and pre_m is not None and update < min(len(pre_b), len(pre_m)):
        return finite(float(pre_m[update] / pre_b[update])) if pre_b[update] else None
    norm_b, norm_m = grad_norm(c, c.baseline, update), grad_norm(c, c.merged, update)
    return finite(norm_m / norm_b) if norm_b and norm_m is not None else None


def apart(x: float, v: float) -> float:
    """How far x is from v, as a factor (log distance)."""
    return abs(math.log(x / v))
