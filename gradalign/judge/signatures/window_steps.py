"""Signatures of what a window's steps and backward passes show: a loss scaler driven per
micro-step, a micro-batch never backpropagated (or cleared before the step), weights edited
inside the window, and the optimizer steps inside it (gradients carried over and penalties
counted K times: accumulation.py).

Each reads a recorded fact, so a match is evidence, not a guess; each returns None when its
fact is absent.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from ...runs.model import Run
from ..distributed import listed
from ..results import Comparison, Diagnosis
from ..windows import changes_in_window, written_after_forwards, written_in_forward
from .clipping import scale_of
from .common import finite, grad_norm, on_ranks, same_direction, window


def scaler_per_micro(c: Comparison) -> Diagnosis | None:
    """A GradScaler unscaled or updated inside the window (counted by the Recorder)."""
    calls = c.merged.scaler_calls
    if calls is None or calls.size == 0 or int(calls.max()) <= 1:
        return None
    first = int(np.flatnonzero(calls.max(axis=1) > 1)[0])
    unscales, updates = (int(v) for v in calls[first])
    where, ranks = on_ranks(c, "update/scaler_calls", first, above=1)
    return Diagnosis(
        "scaler-per-micro",
        f"the loss scaler was driven inside the window{where}: in window {first} "
        f"GradScaler.unscale_() ran {unscales} times and update() {updates} times (once each is "
        "right); every unscale divides the gradients accumulated so far by the scale again",
        {"first_window": first, "unscale_calls": unscales, "update_calls": updates, **ranks},
        "call scaler.unscale_() (before clipping), scaler.step() and scaler.update() once per "
        "window, after the K-th backward; keep one scale for all K micro-steps",
    )


def micro_batch_missing(c: Comparison) -> Diagnosis | None:
    """A micro-step after which no accumulated .grad was written (`micro/grad_writes`), or, in
    runs that recorded fingerprints instead, was bit for bit what it was after the one before:
    that micro-batch was never backpropagated. Not where every window's gradient was written
    once and points the baseline's way at a loss scale's ratio (`_written_once`): a loop that
    backpropagates the window's K losses at once, its Recorder's micro() after that backward,
    leaves the gradient unchanged between its micro-steps too, and the scale it stepped with is
    another cause's (probe runs: one backward of the K losses, not divided by K, 4 times the
    baseline's gradient, was named a micro-batch left out)."""
    run = c.merged
    if all(r.ok for r in c.results):
        return None
    empty = _empty_gradient(c)
    if empty is not None:
        return empty
    states = run.micro_grad_state if run.micro_grad_state is not None else run.micro_grad_writes
    if states is None:
        return None
    params = np.array([t.kind == "param" for t in run.tensors])
    missing = []
    # up to the first divergence: later, a gradient grown to inf stops changing for other reasons
    first = c.first_divergence["update"] if c.first_divergence else len(c.results) - 1
    for i in range(first + 1):
        w = run.window(i)
        for m in range(w.start + 1, w.stop):
            now, before = states[m][params], states[m - 1][params]
            if before.any() and np.array_equal(now, before):
                missing.append((i, m - w.start))
    if not missing:
        return None
    update, position = missing[0]
    k = window(c)
    if _written_once(c, missing, first, k):
        return None  # one backward of the window's losses, scaled: loss-scale's to name
    return Diagnosis(
        "micro-batch-missing",
        f"the accumulated gradient did not change at micro-step {position} (of {k}) of window "
        f"{update}: that micro-batch was forwarded but never backpropagated "
        f"({len(missing)} micro-step(s) in all), so the window holds {k - 1} of its {k} "
        "micro-batches",
        {
            "first_update": update,
            "position_in_window": position,
            "micro_steps_missing": len(missing),
        },
        "call backward() for every micro-batch of the window, the last one included, before "
        "optimizer.step()",
    )


def unrecorded_micro_batches(c: Comparison) -> Diagnosis | None:
    """Merged windows, other than the last, that hold fewer than K micro-steps and other samples
    than the baseline's batch of that update, where the runs hold as many updates and the merged
    optimizer stepped once per window (an epoch's short last window holds the baseline's short
    last batch: its samples agree, and a loss divided there by K is `loss-scale`'s): the loop took K
    batches per step, and one of them was forwarded without a backward, or without its micro-
    step recorded (a Lightning `training_step` that returns None skips the batch's backward; an
    `accelerator.accumulate()` block without `accelerator.backward`). The integrations record a
    micro-step at its backward, so such a window read as K−1 micro-steps and was named
    `window-bookkeeping`, whose fix (call update() once per K micro-steps) did not apply."""
    base, run, k = c.baseline, c.merged, c.merged.accum_steps
    sizes, steps = run.sizes, run.optimizer_steps
    if k < 2 or run.updates != base.updates or len(base.irregular_windows) or steps is None:
        return None
    if base.micro_data is None or run.micro_data is None:
        return None  # no samples to tell a window short of the baseline's batch
    if (sizes > k).any() or (steps[: run.updates] != 1).any():
        return None
    seen, batches = run.window_sums(run.micro_data), base.window_sums(base.micro_data)
    short = [i for i in np.flatnonzero(sizes[:-1] < k) if seen[i] != batches[i]]
    if not short:
        return None  # an epoch's short last batch, the baseline's too: the same samples
    i = int(short[0])
    return Diagnosis(
        "micro-batch-missing",
        f"merged window {i} holds {int(sizes[i])} micro-steps, not K={k} ({len(short)} such "
        f"window(s) before the last), while the optimizer stepped once per window and the runs "
        "hold as many updates: the loop took K micro-batches per step and left a micro-batch "
        "out of the window's gradient, forwarded without a backward (a Lightning training_step "
        "that returns None skips its backward; an accelerator.accumulate() block without "
        "accelerator.backward) or drawn and never used",
        {
            "first_update": i,
            "micro_steps": int(sizes[i]),
            "K": k,
            "short_windows": len(short),
            "merged_updates": run.updates,
        },
        "backpropagate every micro-batch of the window; a batch to skip (a bad sample) is "
        "skipped in both runs alike, before it is drawn into a window",
    )


def _written_once(c: Comparison, missing: list[tuple[int, int]], last: int, k: int) -> bool:
    """Whether every window up to update `last` left its gradient unchanged at all of its
    micro-steps after the first (one backward of the window's losses, micro() after it), and
    the gradient at the first of them is the baseline's in its direction, scaled as a loss
    divided by K too often or not at all is: no micro-batch's share is missing from it."""
    unchanged = Counter(u for u, _ in missing)  # micro-steps left unchanged, by window
    if any(unchanged[u] != k - 1 for u in range(last + 1)):
        return False
    r = c.results[missing[0][0]]
    if r.grad_ratio is None or r.grad_cosine is None or r.grad_cosine < same_direction(c, r):
        return False
    return scale_of(c, r.grad_ratio) is not None


def _empty_gradient(c: Comparison) -> Diagnosis | None:
    """Up to the first divergence, an update where the merged run stepped with a gradient of
    norm 0 (every element of every parameter) and the baseline did not, with no zero_grad()
    counted inside that window: none of the window's micro-batches reached `.grad`."""
    last = c.first_divergence["update"] if c.first_divergence else len(c.results) - 1
    inside = c.merged.zero_grads_inside
    for i in range(last + 1):
        merged, base = grad_norm(c, c.merged, i), grad_norm(c, c.baseline, i)
        if merged != 0.0 or not base or (inside is not None and inside[i] > 0):
            continue
        k, cleared = window(c), _cleared_before_step(c.merged, i)
        why = (
            f"zero_grad() was called after the window's last micro-step and before "
            f"optimizer.step(): it cleared the {k} micro-batches' gradient before the step"
            if cleared
            else f"none of the window's {k} micro-batches reached the parameters' .grad: their "
            "backward ran with gradient sync off (FSDP's set_requires_gradient_sync(False), or "
            "no_sync(), around the last micro-step too), or the gradients were dropped after "
            "the last backward (set to None, or a loss detached before backward())"
        )
        return Diagnosis(
            "micro-batch-missing",
            f"at update {i} the merged run stepped with a gradient of norm 0 in every parameter "
            f"(the baseline's: {base:.4g}): {why}",
            {
                "first_update": i,
                "merged_grad_norm": 0.0,
                "baseline_grad_norm": finite(base),
                **({"zero_grad_before_step": True} if cleared else {}),
            },
            "call zero_grad() after optimizer.step() (or before the window's first micro-step)"
            if cleared
            else "let the last micro-step's backward reduce the gradients (sync on from its "
            "forward), and clear them only after optimizer.step()",
        )
    return None


def _cleared_before_step(run: Run, i: int) -> bool:
    """Whether window i's gradient was cleared after its last micro-step by a zero_grad() that
    came before its optimizer step (one after a GradScaler's skipped step is not)."""
    before, steps = run.zero_grads_before_step, run.optimizer_steps
    return before is not None and steps is not None and bool(before[i] and steps[i])


def inner_steps(run: Run) -> int | None:
    """Optimizer steps taken between two micro-steps of one window (None: not recorded)."""
    if run.micro_step_counts is None:
        return None
    total = 0
    for i in range(run.updates):
        w = run.window(i)
        total += int(run.micro_step_counts[w.start + 1 : w.stop].sum())
    return total


def not_the_optimizer(c: Comparison) -> bool:
    """Whether the merged run's optimizer is known not to have stepped inside its windows: it
    recorded no step between micro-steps; or, where it did not record them, it took as many
    steps per update as the baseline and some window's weights changed more often than those
    steps could change them (a decay per micro-step, not one misplaced step)."""
    inner = inner_steps(c.merged)
    if inner is not None:
        return inner == 0
    steps = c.merged.optimizer_steps
    if steps is None or c.baseline.optimizer_steps is None or _steps_differ(c):
        return False
    exempt = written_in_forward(c.baseline)
    return any(
        changes_in_window(c.merged, r.update, exempt) > int(steps[r.update])
        for r in c.results
        if any(k == "window" for k, _ in r.problems)
    )


def weights_changed_in_window(c: Comparison) -> Diagnosis | None:
    """The weights changed inside a window, yet the optimizer stepped only between windows: an
    EMA or weight average copied in, a manual edit, a decay applied per micro-step."""
    windows = [r for r in c.results if any(k == "window" for k, _ in r.problems)]
    if not windows or _steps_differ(c) or not not_the_optimizer(c):
        return None
    first = windows[0]
    text = next(t for k, t in first.problems if k == "window").rsplit(": ", 1)[0]
    if inner_steps(c.merged) is None:  # steps between micro-steps not recorded: their count
        changes = changes_in_window(c.merged, first.update, written_in_forward(c.baseline))
        steps = int(c.merged.optimizer_steps[first.update])  # type: ignore[index]
        stepped = (
            f"; they changed {changes} times inside that window, more often than its {steps} "
            "optimizer step(s) per update (as many as the baseline's) could change them"
        )
    else:
        stepped = ", yet the optimizer given to the Recorder never stepped inside a window"
    return Diagnosis(
        "weights-changed-in-window",
        f"at update {first.update} {text}{stepped} ({len(windows)} window(s) changed): "
        "something else wrote to the weights between micro-steps (a second optimizer, which "
        "the Recorder does not count, stepped inside the window; or an EMA or weight average "
        "copied in, a decay, a manual edit)",
        {"first_window": first.update, "windows_with_weight_changes": len(windows)},
        "change the weights only at the end of a window: step every optimizer once per update "
        "(a second one's step too), and apply EMA or weight averaging (into a copy), decays "
        "and manual edits after it",
    )


def written_between_micro_steps(c: Comparison) -> Diagnosis | None:
    """Parameters the merged run changed between micro-steps of its windows, never at a
    window's first forward, where the baseline's changes looked like a forward's writes (a K=1
    baseline that updates an EMA copy after update() changes it before its next forward): an
    EMA updated at every micro-step, whose copy failed `unexplained` while the window check
    passed, as a forward's writes."""
    names = written_after_forwards(c.merged, written_in_forward(c.baseline))
    failing = {d.name for r in c.results for d in r.weights if not d.ok}
    if not names or not failing & set(names):
        return None
    return Diagnosis(
        "weights-changed-in-window",
        f"{listed(names, 4)} changed between micro-steps of the merged run's windows, never at "
        "a window's first forward (as a forward's writes would), while the baseline changed "
        "them once per update: the loop wrote them inside the window (an EMA or weight "
        "average updated at every micro-step)",
        {"tensors": names},
        "update an EMA or weight average once per update, after optimizer.step(), as the "
        "baseline does",
    )


def _steps_differ(c: Comparison) -> bool:
    return any(k in ("optimizer_steps", "state_step") for r in c.results for k, _ in r.problems)
