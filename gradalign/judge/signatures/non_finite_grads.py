"""`non-finite` read from the gradients: at the first failing update the merged run's gradient
holds an inf or a NaN while its losses and the baseline's gradient are finite, and the merged
run stepped there (a step a loss scaler skipped is `scaler-skips`'). No ratio, cosine or scale
can be read from it, so nothing else is named from that update's numbers (a NaN in a merged
gradient file was `unexplained`, an inf `cross-sample-loss`, "inf times what noise allows")."""

from __future__ import annotations

import math

from ...runs.model import Run
from ..distributed import listed
from ..results import Comparison, Diagnosis, UpdateResult
from .common import failing


def _stepped(run: Run, update: int) -> bool:
    """Whether the run's optimizer stepped at `update` (true where it did not record steps)."""
    steps = run.optimizer_steps
    return steps is None or update >= len(steps) or steps[update] != 0


def _merged_not_finite(r: UpdateResult) -> list[str]:
    """The tensors whose merged gradient is not finite at `r` while the baseline's is: an
    error that is not finite beside a baseline norm that is (the whole model's norms where the
    diff kept no per-tensor norm, as sketched runs)."""
    found = [
        d.name
        for d in r.grads
        if d.excused is None
        and not math.isfinite(d.error)
        and d.norm is not None
        and math.isfinite(d.norm)
    ]
    if found or r.grad_norms is None:
        return found
    base, merged = r.grad_norms[:2]
    if math.isfinite(base) and not math.isfinite(merged):
        return [d.name for d in r.grads if d.excused is None and not math.isfinite(d.error)]
    return []


def non_finite_gradient(c: Comparison) -> Diagnosis | None:
    r = failing(c)
    if r is None or not _stepped(c.merged, r.update) or c.merged.non_finite_losses().size:
        return None
    names = _merged_not_finite(r)
    if not names:
        return None
    return Diagnosis(
        "non-finite",
        f"at update {r.update} the merged run's gradient of {listed(names, 4)} is not finite "
        "(an inf or a NaN) while its losses and the baseline's gradient are finite, and it "
        "stepped with it: nothing can be compared there as numbers",
        {"update": r.update, "tensors": names},
        "find where the merged run's backward overflows: a loss or gradient scaled by K or "
        "more than the baseline's (in float16 without a loss scaler), a division by a count "
        "that can be 0 in a micro-batch (items, tokens, valid targets), a GradScaler that "
        "unscaled without skipping the step",
    )
