"""A baseline whose loss blows up: without a float64 reference, fixed tolerances cannot tell the
rounding such a training multiplies from a bug, so a failure that starts where the loss jumped
carries a warning saying so (`unstable_note`). With a reference the noise floor is measured in
that very training, and no warning is needed."""

from __future__ import annotations

import math

from .results import UpdateResult

JUMP = 10.0  # a loss this many times the lowest loss before it has blown up
NEAR = 1  # a failure from this many updates before the jump on is the jump's


def unstable_note(results: list[UpdateResult], calibrated: bool) -> list[str]:
    """A warning where, without a reference, the first failing update comes at or just before
    the first update whose baseline loss is JUMP times the lowest before it (positive losses)."""
    failed = next((r.update for r in results if not r.ok), None)
    if calibrated or failed is None:
        return []
    lowest = math.inf
    for r in results:
        loss = r.base_loss
        if not (math.isfinite(loss) and loss > 0):
            return []  # a loss of another kind (a negative log-likelihood bound, a reward)
        if loss > JUMP * lowest:
            if failed < r.update - NEAR:
                return []
            return [
                f"warning: the baseline's loss jumped from {lowest:.3g} to {loss:.3g} "
                f"({loss / lowest:.3g}x) at update {r.update}, and the runs differ from update "
                f"{failed} on: a training this unstable multiplies rounding, which the fixed "
                "tolerances cannot tell from a bug's effect; judge against a float64 reference "
                "(gradalign baseline writes one; Recorder(..., reference=...)), or at a learning "
                "rate that does not blow up"
            ]
        lowest = min(lowest, loss)
    return []
