"""Gradients at updates both runs' optimizers skipped: a loss scaler (torch.amp.GradScaler)
that found an inf or a NaN in the unscaled gradients skips the step, in both runs alike where
both overflowed. Recorded after `unscale_()`, those gradients hold the inf; neither run stepped
with them, so they are not judged where either is not finite (a GradScaler at init_scale 2**30
skipped updates 0 to 10 in both runs of a cold probe's loop: every gradient failed at infx,
`cross-sample-loss`). Gradients finite in both runs are judged as any others."""

from __future__ import annotations

import math

from ..runs.model import Run
from .kinks import excuse
from .results import UpdateResult

SKIPPED = "a step both runs skipped"


def excuse_skipped_gradients(results: list[UpdateResult], base: Run, merged: Run) -> list[str]:
    """Excuse, in place, the gradients that are not finite at updates where both runs recorded
    no optimizer step; one note naming those updates."""
    steps_b, steps_m = base.optimizer_steps, merged.optimizer_steps
    if steps_b is None or steps_m is None:
        return []
    at = []
    for r in results:
        u = r.update
        if u >= len(steps_b) or u >= len(steps_m) or steps_b[u] != 0 or steps_m[u] != 0:
            continue
        names = {d.name for d in r.grads if not math.isfinite(d.error)}
        if names:
            excuse(r, names, SKIPPED)
            if r.grad_norms is not None and not all(map(math.isfinite, r.grad_norms[:2])):
                r.grad_norms = None  # the whole model's norm: the same inf, not judged
            at.append(u)
    if not at:
        return []
    shown = ", ".join(map(str, at[:8])) + (f" and {len(at) - 8} more" if len(at) > 8 else "")
    return [
        f"update(s) {shown}: both runs' optimizers skipped the step (a loss scaler found an inf "
        "or NaN) and their gradients there are not finite: never stepped with, not judged"
    ]
