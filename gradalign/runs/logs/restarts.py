"""What a step number out of order says: lines lost or printed every few steps (a step ahead of
the one expected), a run resumed from a checkpoint, or a count that restarts (a step behind).
Numpy-free."""

from __future__ import annotations

from .names import EVERY_STEP_ADVICE


def why_again(value: int, expected: int, first: int) -> str:
    """Why a step may come again: from its first value, a loop that counts again; from a later
    one, a run resumed from a checkpoint, whose repeated steps supersede the ones before."""
    if value == expected:
        return ""
    if value > expected:
        missing = (
            f"step {expected} is"
            if value == expected + 1
            else f"steps {expected} to {value - 1} are"
        )
        if expected > first + 1:  # within the log: lines lost, or printed without a loss
            return f": {missing} not in the log (a line lost, or one printed without its loss?)"
        return (
            f": {missing} not in the log (printed every {value - expected + 1} steps, or a "
            "step column that counts samples, as DeepSpeed's monitor files do? Printed every n "
            f"steps, its lines may be means over the steps since the last: {EVERY_STEP_ADVICE})"
        )
    if value > first:
        return (
            f" again: a run resumed from a checkpoint? Steps {value} to {expected - 1} are "
            "printed twice and the later lines supersede the earlier: give the log of one "
            f"uninterrupted run, or delete the earlier lines of steps {value} to {expected - 1}; "
            "else an evaluation loop or another process printing step lines into this log"
        )
    return (
        " again: the steps restart (two processes printing into one log, an evaluation loop, "
        "a run restarted from step 0, or a new epoch the step line does not name)"
    )
