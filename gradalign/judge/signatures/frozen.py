"""Tensors trained from another update in each run: a freeze schedule (`requires_grad` set back
to True after some steps) counted in micro-steps in one run and in updates in the other. Their
gradient is exactly zero in one run and not in the other at the first failing update, while
both runs held it at zero before; the other tensors' gradients were computed from weights that
still agree, so nothing else fails there but those tensors' own weights, which one run moved."""

from __future__ import annotations

from ..metrics import TensorDiff
from ..results import Comparison, Diagnosis
from .common import failing

_SHOWN = 3


def _zero(d: TensorDiff) -> tuple[bool, bool] | None:
    """Whether the baseline's and the merged gradient are exactly zero (None: not known, as
    for a diff from sketches or printed values, which keeps no baseline norm)."""
    if d.norm is None or d.sketched:
        return None
    if d.norm == 0:
        return True, d.max_abs == 0
    return False, d.rel_l2 == 1.0 and d.cosine == 0.0  # m − b = −b: m is zero


def _trained_from(c: Comparison, name: str, run: int) -> int | None:
    """The first update at which run `run` (0 baseline, 1 merged) held a non-zero gradient for
    `name` (None: none did)."""
    for r in c.results:
        for d in r.grads:
            if d.name == name and (zero := _zero(d)) is not None and not zero[run]:
                return r.update
    return None


def _from(update: int | None) -> str:
    return "never" if update is None else f"from update {update}"


def trained_from_another_update(c: Comparison) -> Diagnosis | None:
    r = failing(c)
    if r is None or not r.update or not r.loss_ok:
        return None
    apart = [d for d in r.grads if not d.ok and (z := _zero(d)) is not None and z[0] != z[1]]
    names = [d.name for d in apart]
    if not apart or any(not d.ok and d.name not in names for d in (*r.grads, *r.weights)):
        return None  # the step moved only them: every other tensor still agrees
    earlier = {d.name: _zero(d) for e in c.results[: r.update] for d in e.grads if d.name in names}
    if any(zero != (True, True) for zero in earlier.values()) or len(earlier) < len(names):
        return None  # trained before in either run: not a tensor unfrozen here
    base_from = _trained_from(c, names[0], 0)
    merged_from = _trained_from(c, names[0], 1)
    more = f" and {len(names) - _SHOWN} more" if len(names) > _SHOWN else ""
    return Diagnosis(
        "lr-schedule",
        f"{', '.join(names[:_SHOWN])}{more} get a gradient {_from(merged_from)} in the merged "
        f"run and {_from(base_from)} in the baseline, zero in both before: they were unfrozen "
        "(requires_grad) at another point of the training, as at a count of micro-steps instead "
        "of updates",
        {
            "first_update": r.update,
            "tensors": names,
            "baseline_from": base_from,
            "merged_from": merged_from,
        },
        "unfreeze them (or add their param group) at the same update in both runs: count "
        "optimizer steps, not micro-batches",
    )
