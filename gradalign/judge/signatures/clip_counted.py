"""Clips the Recorder counted inside the merged run's windows (`update/clip_calls`): partial
sums clipped, read where the clip engaged and where it engaged nowhere in this run."""

from __future__ import annotations

import math

from ..clip_norms import clipped_inside
from ..results import Comparison, Diagnosis, UpdateResult
from .clipping import CLIP_ONCE, clip_per_micro_engaged, clip_state, clip_value_per_micro
from .common import finite, grad_norm, on_ranks


def clip_per_micro_counted(c: Comparison, r: UpdateResult) -> Diagnosis | None:
    """The merged run clipped more often in the failing update's window than the baseline did
    per update: partial sums were clipped (by norm or by value). Read by the clip's shape where
    it fits, else by the counts alone (`_counted_alone`)."""
    counts = c.merged.clip_calls
    if counts is None:
        return None
    i = r.update
    once = 1 if c.baseline.clip_calls is None else int(c.baseline.clip_calls[i])
    if int(counts[i]) <= max(once, 1):
        return None
    found = clip_per_micro_engaged(c, r) or clip_value_per_micro(c, r) or _counted_alone(c, r)
    if found is not None:
        where, ranks = on_ranks(c, "update/clip_calls", i, above=max(once, 1))
        found.evidence.update(clip_calls={"merged": int(counts[i]), "baseline": once}, **ranks)
        called = "clip_grad_value_" if "clip_value" in found.evidence else "clip_grad_norm_"
        found.message += f" ({called} called {int(counts[i])} times{where} in window {i})"
    return found


def _counted_alone(c: Comparison, r: UpdateResult) -> Diagnosis | None:
    """The baseline called its clip by norm at the failing update and the merged run clipped
    inside the window, where no clip's shape reads the gradients (`clip_per_micro_engaged`):
    the whole did not reach the baseline's clip, or an optimizer that steps by signs (Rprop)
    leaves no ratio to read. The calls alone are a bug; named by them."""
    calls = c.baseline.clip_calls
    if calls is None or int(calls[r.update]) < 1:
        return None  # the baseline does not clip there: a clip in one run, clip_threshold's
    if c.baseline.clip_value is not None and math.isfinite(c.baseline.clip_value[r.update]):
        return None  # by value: clip_value_per_micro's reading, or none
    clipped, _ = clip_state(c, c.baseline, r.update)
    base = grad_norm(c, c.baseline, r.update)
    shown = f" (its norm {base:.4g})" if base is not None else ""
    whole = (
        "its clip engaged, yet no clip of partial sums reads the merged gradient's shape"
        if clipped
        else "it did not reach its clip: a partial sum of the micro-batches' gradients can be "
        "longer than their whole (they partly cancel), so a clip of partial sums engages where "
        "the baseline's clip of the whole gradient did not"
    )
    return Diagnosis(
        "clip-per-micro",
        f"the gradients differ first at update {r.update}, where the merged run clipped inside "
        f"the window and the baseline called its clip once, on its accumulated gradient{shown}: "
        f"{whole}",
        {"update": r.update, "baseline_grad_norm": finite(base), "baseline_clipped": clipped},
        CLIP_ONCE,
    )


def clip_per_micro_unengaged(c: Comparison) -> Diagnosis | None:
    """The Recorder counted more clip calls in the merged run's windows than in the baseline's
    updates, and every gradient agrees: the clips inside the windows engaged nowhere in this
    run (a norm below max_norm, no element beyond clip_value), yet they clip partial sums, and
    the first window whose partial sum reaches the threshold trains otherwise; or they moved
    the gradients within their tolerance and the weights apart (an optimizer that steps by
    signs, Rprop, turns a small change of a gradient into a whole step)."""
    if any(not d.ok for r in c.results for d in r.grads):
        return None  # a clip that engaged: clip_per_micro_counted reads it by the gradient
    weights_ok = all(d.ok for r in c.results for d in r.weights)
    updates = [r.update for r in c.results]
    inside = clipped_inside(c.baseline, c.merged, updates)
    if not inside:
        return None
    i = inside[0]
    calls, once = int(c.merged.clip_calls[i]), int(c.baseline.clip_calls[i])
    values = c.merged.clip_value
    by_value = values is not None and i < len(values) and math.isfinite(values[i])
    called = "clip_grad_value_" if by_value else "clip_grad_norm_"
    where, ranks = on_ranks(c, "update/clip_calls", i, above=once)
    return Diagnosis(
        "clip-per-micro",
        f"the merged run called {called} {calls} times{where} in window {i} against the "
        f"baseline's {once} per update ({len(inside)} of {len(updates)} windows): it clips "
        f"partial sums inside the window. {_UNSEEN if weights_ok else _WEIGHTS_APART}",
        {
            "first_window": i,
            "windows": len(inside),
            "clip_calls": {"merged": calls, "baseline": once},
            "engaged": not weights_ok,
            **ranks,
        },
        CLIP_ONCE,
    )


_UNSEEN = (
    "No clip engaged in this run (its weights and gradients agree with the baseline's), but the "
    "first window whose partial sum reaches the clip threshold will step with another gradient "
    "than the baseline's"
)
_WEIGHTS_APART = (
    "The gradients agree within their tolerance and the weights do not: clips of partial sums "
    "moved the gradients a little, and the steps followed"
)
