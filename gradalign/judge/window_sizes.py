"""Window sizes: did every window of a run hold K micro-steps and end with update()?

A loop that calls micro() more or fewer times than K in a window, or forgets update(), is
recorded as it ran (the Recorder does not refuse it). Its windows no longer line up with the
baseline's batches from the first irregular one on: updates before it are judged as usual, the
rest are not comparable, and the check below fails with the facts.
"""

from __future__ import annotations

from ..runs.model import Run


def problems(run: Run, role: str) -> list[str]:
    """What is wrong with a run's windows, in words (empty: nothing)."""
    found = []
    irregular = run.irregular_windows
    if irregular.size:
        i = int(irregular[0])
        found.append(
            f"{role} window {i} holds {int(run.sizes[i])} micro-steps, not K={run.accum_steps} "
            f"({irregular.size} irregular window(s))"
        )
    if run.unclosed_micro_steps:
        never = " update() was never called" if run.updates == 0 else ""
        found.append(
            f"{role} has {run.unclosed_micro_steps} micro-step(s) after its last update():"
            f"{never or ' the last window never ended'}"
        )
    return found


def judged_updates(base: Run, merged: Run) -> int:
    """How many updates line up: up to the first irregular window of either run."""
    n = min(base.updates, merged.updates)
    for run in (base, merged):
        if run.irregular_windows.size:
            n = min(n, int(run.irregular_windows[0]))
    return n


def has_problems(run: Run) -> bool:
    return bool(run.irregular_windows.size or run.unclosed_micro_steps)
