"""Micro-steps whose gradient a zero_grad() cleared before their window stepped.

A loop that counts its windows by `(i + 1) % K` over a loader whose length is not a multiple of
K forwards and backpropagates the epoch's leftover micro-batches, and a zero_grad() at the next
epoch's start (or a clear by hand, `p.grad = None`, which the Recorder sees at the next
micro-step: record/states.py `GradWrites`) clears what they accumulated: the window that
follows holds K + d micro-steps, d of them discarded, and trains on its last K alone, as the
baseline (whose loader dropped the short batch) does. The Recorder counts, per window, the
micro-steps before its last clear between two micro-steps, where no optimizer step came before
it in the window (`update/discarded_micro_steps`). A window that holds exactly K micro-steps
after them, at the weights the discarded ones saw (`micro/state`), is read as those K: the
discarded ones leave every per-micro-step series (their losses, samples and fingerprints; each
rank's too), and a note says so. Any other window is left as it was recorded: a zero_grad()
after every micro-step (K − 1 discarded, one left) is a bug for the window check and
`zero-grad-in-window` to name (its counts stay on the run: `cleared_inside`), and leftovers
whose gradient was carried into the next window (no clear) hold K + d micro-steps that all
trained.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .model import Run

# per-micro-step counts "since the micro-step before": a dropped row's count moves to the next
_SINCE_BEFORE = ("micro_step_counts", "micro_draws")


def drop_discarded(run: Run, discarded: np.ndarray | None) -> Run:
    """`run` without the discarded micro-steps of its windows that hold K after them."""
    if discarded is None or not discarded.any():
        return run
    sizes, k, starts = run.sizes, run.accum_steps, run.starts
    windows = [
        i
        for i in range(run.updates)
        if discarded[i] and sizes[i] - discarded[i] == k and _still(run, starts[i], discarded[i])
    ]
    left = discarded.copy()
    left[windows] = 0  # leftovers, read out of the run: what stays cleared is the loop's
    if not windows:
        return dataclasses.replace(run, cleared_inside=left)
    keep = np.ones(run.micro_steps, dtype=bool)
    for i in windows:
        keep[starts[i] : starts[i] + int(discarded[i])] = False
    drew = run.micro_draws
    drawn = tuple(
        i for i in windows if drew is not None and drew[starts[i] : starts[i] + discarded[i]].any()
    )
    changes = _kept(run, keep)
    changes["discarded_draws"] = drawn
    changes["cleared_inside"] = left if left.any() else None
    changes["ranks"] = [dataclasses.replace(r, **_kept(r, keep)) for r in run.ranks]
    new_sizes = sizes.copy()
    new_sizes[windows] = k
    changes["window_sizes"] = None if (new_sizes == k).all() else new_sizes
    if run.zero_grads_inside is not None:
        inside = run.zero_grads_inside.copy()
        inside[windows] = 0  # the last zero_grad() inside came before the K kept micro-steps
        changes["zero_grads_inside"] = inside
    dropped = int(discarded[windows].sum())
    note = (
        f"{run.source}: {dropped} micro-step(s) at the start of {len(windows)} window(s) (first: "
        f"update {windows[0]}) had their gradient cleared (zero_grad(), or .grad set to None) "
        f"before the window's K={k} micro-steps (a partial window at the end of the data, "
        "dropped): left out"
    )
    return dataclasses.replace(run, **changes, notes=[*run.notes, note])


def _still(run: Run, start: int, discarded: int) -> bool:
    """Whether the weights stood still from the window's first micro-step to its first kept
    one (their fingerprints, `micro/state`): a closure that an optimizer evaluates several
    times per step (LBFGS) clears the gradient between evaluations at weights it moved, and
    those are no leftovers."""
    state, known = run.micro_state, run.micro_state_known
    rows = slice(int(start), int(start) + int(discarded) + 1)
    if state is None or (known is not None and not known[rows].all()):
        return False
    return bool((state[rows] == state[rows][:1]).all())


def _kept(series: object, keep: np.ndarray) -> dict[str, np.ndarray]:
    """The per-micro-step arrays of a run (or of one of its ranks) at the kept micro-steps."""
    out = {}
    for f in dataclasses.fields(series):  # type: ignore[arg-type]
        value = getattr(series, f.name)
        micro = f.name.startswith("micro_") or f.name in ("loss_quantum", "loss_known")
        if micro and isinstance(value, np.ndarray) and value.shape[:1] == keep.shape:
            out[f.name] = (_carried(value, keep) if f.name in _SINCE_BEFORE else value)[keep]
    return out


def _carried(counts: np.ndarray, keep: np.ndarray) -> np.ndarray:
    """Per-micro-step counts since the row before, each dropped row's added to the next kept."""
    out = counts.copy()
    carry = 0
    for m in range(len(out)):
        if not keep[m]:
            carry += int(out[m])
        elif carry:
            out[m] += carry
            carry = 0
    return out
