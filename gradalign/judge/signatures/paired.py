"""A gradient scaled by the wrong factor beside, or behind, something else: read its size every
way it can be read (the fitted ratio, the norm, the norms before clipping), divide it out, and
read what remains (`with_loss_scale`)."""

from __future__ import annotations

import math

from ..results import Comparison, Diagnosis, UpdateResult
from .clipping import clip_state, pre_clip_ratio
from .common import finite, grad_norm, noise_share, scaled_error, window
from .gradient import token_normalization


def with_loss_scale(c: Comparison, r: UpdateResult, turned: bool = False) -> list[Diagnosis]:
    """Two causes at once: a gradient K, 1/K or K+1 times too large (within 5%) whose direction
    is off too. The size is read by the fitted ratio, by the norm (the fit shrinks with the
    cosine, the norm does not) and, where a clip engaged, by the norms before clipping (a
    clip hides the scale in the gradient stepped with). Divide the fitted ratio out and read the
    rest again: `loss-scale` and the signature that explains the remainder (e.g. token
    normalization), `loss-scale` alone where the remainder is within the gradient's noise (a
    clip hid the scale), or nothing. `turned`: a cause named beside it turns every gradient a
    little (BatchNorm, a loss over the micro-batch), which explains any remainder."""
    ratio, k = r.grad_ratio, window(c)
    if ratio is None or not math.isfinite(ratio):
        return []
    found = _near(_sizes(c, r), (k, 1 / k, k + 1))
    if found is None:
        return []
    rest = token_normalization(c, r, scale=ratio)
    alone = rest is None and _remainder_within_noise(c, r, ratio)
    if rest is None and not alone and not turned:
        return []
    value, what, expected = found
    named = "K" if expected == k else "K+1" if expected == k + 1 else "1/K"
    beside = (
        "with nothing beyond the gradient's noise left once that is divided out"
        if alone
        else "beside a second cause that turns its direction"
        + (" (named with it)" if rest is None else "")
    )
    scaled = Diagnosis(
        "loss-scale",
        f"the accumulated gradient{what} is {value:.4g} times the baseline's at update "
        f"{r.update} ({named} = {expected:.4g}), {beside}: the loss is scaled by the wrong "
        "factor",
        {
            "update": r.update,
            "grad_ratio": finite(ratio),
            "size_ratio": finite(value),
            "expected_ratio": expected,
        },
        "scale each micro-batch's loss by its share of the window (1/K, or its items over the "
        "window's items), once",
    )
    return [scaled] if rest is None else [scaled, rest]


def _remainder_within_noise(c: Comparison, r: UpdateResult, scale: float) -> bool:
    """The merged gradient divided by `scale` stands within its noise (`noise_share`)."""
    error = scaled_error(c, r, scale)
    return error is not None and error <= noise_share(c, r)


def _near(
    sizes: list[tuple[float, str]], expected: tuple[float, ...]
) -> tuple[float, str, float] | None:
    """The first size within 5% of an expected ratio: (size, its words, that ratio)."""
    for value, what in sizes:
        for v in expected:
            if abs(value / v - 1) <= 0.05:
                return value, what, v
    return None


def _sizes(c: Comparison, r: UpdateResult) -> list[tuple[float, str]]:
    """The merged gradient's size over the baseline's, each way it can be read, with words."""
    i = r.update
    sizes = [(float(r.grad_ratio), "")] if r.grad_ratio is not None else []
    (_, norm_b), (_, norm_m) = (clip_state(c, run, i) for run in (c.baseline, c.merged))
    if norm_b is None:  # no norm before clipping recorded: clip_state read no gradient
        norm_b = grad_norm(c, c.baseline, i)
    if norm_m is None:
        norm_m = grad_norm(c, c.merged, i)
    if norm_m is not None and norm_b:
        sizes.append((norm_m / norm_b, "'s norm"))
    before = pre_clip_ratio(c, i)
    if before is not None:
        sizes.append((before, "'s norm before clipping"))
    return [(x, what) for x, what in sizes if math.isfinite(x) and abs(x - 1) > 0.05]
