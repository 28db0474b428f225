"""Window sizes: did every window of a run hold K micro-steps and end with update()?

A loop that calls micro() more or fewer times than K in a window, or forgets update(), is
recorded as it ran (the Recorder does not refuse it). Its windows no longer line up with the
baseline's batches from the first irregular one on: updates before it are judged as usual, the
rest are not comparable, and the check below fails with the facts.

One kind of window of another size is training, not a bug: the end of the data, as the
frameworks close an epoch that does not fill K micro-batches (the baseline's last batch is short
as well). Such a window lines up with the baseline's batch; what it holds is the samples
check's to judge.
Nor is a last partial window that never stepped (fewer than K micro-steps after the last
update(), as many updates as the baseline's): the end of the data, which the baseline's loader
dropped as a short batch; it trained nothing (`left_over`). Micro-steps whose gradient a
zero_grad() cleared before their window's K are read out of the run (runs/discarded.py).
"""

from __future__ import annotations

import numpy as np

from ..runs.digests import wrap
from ..runs.model import Run


def irregular(run: Run, base: Run | None = None) -> np.ndarray:
    """Windows of `run` that do not hold K micro-steps, less those at the end of the data
    (`data_boundaries`, given the baseline)."""
    found = run.irregular_windows
    if base is None or not found.size:
        return found
    kept = set(data_boundaries(run, base))
    return np.array([i for i in found if int(i) not in kept], dtype=np.int64)


def data_boundaries(run: Run, base: Run) -> list[int]:
    """Windows of another size than K at the end of the data: those holding exactly the
    baseline's batch of their update (digest and rows), and those holding fewer micro-steps than
    K where the baseline's batch is short too (its rows below its largest batch's). The samples
    check then judges what such a window holds (a sampler that pads with a repeated sample)."""
    if run is base or run.micro_data is None or base.micro_data is None:
        return []
    found = []
    for i in map(int, run.irregular_windows):
        if i >= base.updates or i >= run.updates:
            continue
        if _same_batch(run, base, i) or _both_short(run, base, i):
            found.append(i)
    return found


def _rows(run: Run, i: int) -> int | None:
    if run.micro_samples is None:
        return None
    w = run.window(i)
    return int(run.micro_samples[w.start : w.stop].sum())


def _same_batch(run: Run, base: Run, i: int) -> bool:
    mine, theirs = run.window(i), base.window(i)
    digests = wrap(int(run.micro_data[mine.start : mine.stop].sum())) == wrap(
        int(base.micro_data[theirs.start : theirs.stop].sum())
    )
    rows = _rows(run, i), _rows(base, i)
    return digests and (None in rows or rows[0] == rows[1])


def _both_short(run: Run, base: Run, i: int) -> bool:
    if base.micro_samples is None or int(run.sizes[i]) >= run.accum_steps:
        return False
    largest = max(_rows(base, u) or 0 for u in range(base.updates))
    rows = _rows(base, i)
    return rows is not None and rows < largest


def problems(run: Run, role: str, base: Run | None = None) -> list[str]:
    """What is wrong with a run's windows, in words (empty: nothing); `base`: the baseline, by
    whose batches a window at the end of the data lines up."""
    found = []
    odd = irregular(run, base)
    if odd.size:
        i = int(odd[0])
        found.append(
            f"{role} window {i} holds {int(run.sizes[i])} micro-steps, not K={run.accum_steps} "
            f"({odd.size} irregular window(s)){carried_in(run, i)}"
        )
    if run.unclosed_micro_steps and not left_over(run, base):
        never = " update() was never called" if run.updates == 0 else ""
        found.append(
            f"{role} has {run.unclosed_micro_steps} micro-step(s) after its last update():"
            f"{never or ' the last window never ended'}"
        )
    if run.unclosed_steps and update_first(run):
        found.append(
            f"{role} called update() before optimizer.step() in every window ({_UPDATE_FIRST}): "
            "each update's weights were recorded before its step, and the last step's never"
        )
    elif run.unclosed_steps:
        found.append(
            f"{role} stepped its optimizer {run.unclosed_steps} time(s) after its last "
            "update(), with no micro-step after it: the weights it ended with were never "
            "recorded (a last partial window stepped where there was none?)"
        )
    return found


_UPDATE_FIRST = (
    "update 0 holds no optimizer step, each later window's step came before its first "
    "micro-step, and one came after the last update()"
)
UPDATE_FIRST_FIX = "; call Recorder.update() after optimizer.step(), not before it"


def update_first(run: Run) -> bool:
    """Whether each window's step came after its update(): none in update 0, one in every
    later window and before its first micro-step, one after the last update()."""
    steps, counts = run.optimizer_steps, run.micro_step_counts
    if run.unclosed_steps != 1 or steps is None or counts is None or run.updates < 2:
        return False
    firsts = counts[run.starts[1:]]
    return bool(steps[0] == 0 and (steps[1:] == 1).all() and (firsts == 1).all())


CARRIED = "a partial window's gradient carried into the next"
CARRIED_FIX = (
    "; clear a partial window that did not step before the next window begins "
    "(optimizer.zero_grad() at each epoch's start), or step on it"
)


def carried_in(run: Run, i: int) -> str:
    """What a window holding more than K micro-steps, none cleared inside it, tells: the
    micro-steps before its last K (a partial window at an epoch's end that never stepped)
    added their gradient to its K (empty where that is not so, or not known)."""
    extra = int(run.sizes[i]) - run.accum_steps
    inside = run.zero_grads_inside
    if extra <= 0 or inside is None or inside[i]:
        return ""
    return (
        f": its first {extra} trained with it, no zero_grad() between them and the K after "
        f"({CARRIED}, as from the end of an epoch?)"
    )


def left_over(run: Run, base: Run | None) -> bool:
    """Whether the micro-steps after `run`'s last update() are the end of the data left
    unstepped: fewer than K, no optimizer step after them, and as many updates as the baseline
    (whose loader dropped the short batch they would have made): they trained nothing."""
    short = 0 < run.unclosed_micro_steps < run.accum_steps and not run.unclosed_steps
    return short and base is not None and base is not run and run.updates == base.updates


def judged_updates(base: Run, merged: Run) -> int:
    """How many updates line up: up to the first irregular window of either run."""
    n = min(base.updates, merged.updates)
    for found in (irregular(base), irregular(merged, base)):
        if found.size:
            n = min(n, int(found[0]))
    return n


def has_problems(run: Run) -> bool:
    return bool(run.irregular_windows.size or run.unclosed_micro_steps or run.unclosed_steps)
