"""The inside-window check: with accumulation, weights may change only at a window's last step."""

from __future__ import annotations

import itertools

import numpy as np

from ..runs.model import Run


def inside_window_changes(run: Run, exempt: frozenset[str] = frozenset()) -> dict[int, list[str]]:
    """Per update, where the weights changed inside its window.

    Row m of `micro_state` is the weights micro-step m computed with (a Recorder takes it at
    micro-step m; a log prints it after micro-step m-1). Every row of window i must equal the
    weights after update i-1 (the initial weights for i=0). A row that differs while the row
    before it did not means the optimizer stepped at the micro-step before it; where rows are
    unknown (a log has no initial weights, or prints only some steps), the step is placed
    between the last row seen unchanged and the first changed one, never earlier than seen.
    Only parameters count: buffers such as BatchNorm's running statistics change in forward.
    `exempt`: parameters the model writes itself while it computes (`written_in_forward` of the
    baseline), whose changes inside a window are training, not a step.
    """
    if run.micro_state is None or run.accum_steps == 1:
        return {}
    known = _known(run)
    params = _watched(run, exempt)
    names = [t.name for t in run.tensors]
    found: dict[int, list[str]] = {}
    for i in range(run.updates):
        span = run.window(i)
        window = [m for m in span if known[m]]
        start = _window_start(run, i)
        last_same = span.start - 1  # the window's start: "after the micro-step before it"
        if start is None:
            if not window:
                continue
            start, last_same = run.micro_state[window[0]], window[0]
            window = window[1:]
        for m in window:
            changed = np.flatnonzero((run.micro_state[m] != start) & params)
            if not changed.size:
                last_same = m
                continue
            unseen = "" if _window_start(run, i) is not None else _UNSEEN
            found[i] = [
                _where(last_same, m, i, span) + f", first in {names[changed[0]]}{unseen}: "
                "written inside the window (by a step or an edit)"
            ]
            break
    return found


_UNSEEN = " (the first change this source can show; it holds no earlier weights)"


def _where(last_same: int, changed: int, update: int, span: range) -> str:
    """The micro-step(s) the weights changed at: after row `last_same`, before row `changed`."""

    def at(m: int) -> str:
        return f"micro-step {m} (position {m - span.start + 1} of {len(span)})"

    if changed == span.start:
        since = "the initial weights" if update == 0 else f"update {update - 1}"
        return f"the weights changed after {since}, before {at(changed)}"
    if changed - 1 == max(last_same, span.start):
        return f"the weights changed at {at(changed - 1)}, before micro-step {changed}"
    first = max(last_same, span.start)
    return f"the weights changed between {at(first)} and {at(changed - 1)}"


def written_in_forward(run: Run, kind: str = "param", between: bool = False) -> frozenset[str]:
    """Tensors of `kind` ("param" or "buffer") that changed between a window's start and one of
    its micro-steps with no optimizer step in between: the model writes them while it computes
    (an Embedding with `max_norm` renormalizes the rows it looks up, in place; a running mean
    of the inputs). Read from a baseline, such parameters name what a merged run may change
    inside its windows as the baseline does; unobservable rows add none. `between`: only those
    that changed between two micro-steps of a window, not before its first (a statistic the
    loop updates once per window, at its start, is written once per update in both runs)."""
    if run.micro_state is None or run.micro_step_counts is None:
        return frozenset()
    known = _known(run)
    written = np.zeros(len(run.tensors), dtype=bool)
    for i in range(run.updates):
        start = _window_start(run, i)
        span = run.window(i)
        if start is None or not span:
            continue
        for m in span:
            before = 0 if m > span.start else int(i > 0)  # the previous update's own step
            if run.micro_step_counts[m] > before or not known[m]:
                break  # an optimizer step before this row: it and later rows say nothing
            if not between:
                written |= run.micro_state[m] != start
            elif m > span.start and known[m - 1]:
                written |= run.micro_state[m] != run.micro_state[m - 1]
    return frozenset(
        t.name for t, w in zip(run.tensors, written, strict=True) if w and t.kind == kind
    )


def written_after_forwards(run: Run, names: frozenset[str]) -> list[str]:
    """Of the parameters `names` (those a baseline changes as a forward writes them), those that
    `run` changed between two micro-steps of a window, and never between a window's start and
    its first micro-step: a forward writes a tensor at every forward, the first included, so
    these were written after the window's micro-steps, by the loop (an EMA copy updated at every
    micro-step, which a K=1 baseline updating it after update() shows as a forward's write)."""
    if run.micro_state is None or run.micro_step_counts is None or run.accum_steps == 1:
        return []
    known, columns = _known(run), [i for i, t in enumerate(run.tensors) if t.name in names]
    if not columns:
        return []
    first = np.zeros(len(columns), dtype=bool)
    between = np.zeros(len(columns), dtype=bool)
    for i in range(run.updates):
        span, start = run.window(i), _window_start(run, i)
        if not span:
            continue
        if start is not None and known[span.start] and run.micro_step_counts[span.start] <= (i > 0):
            first |= run.micro_state[span.start][columns] != start[columns]
        for m in range(span.start + 1, span.stop):
            if known[m] and known[m - 1] and run.micro_step_counts[m] == 0:
                between |= run.micro_state[m][columns] != run.micro_state[m - 1][columns]
    return [
        run.tensors[c].name for c, b, f in zip(columns, between, first, strict=True) if b and not f
    ]


def observable_windows(run: Run) -> int:
    """How many windows hold two rows that can be compared (their start counts as one)."""
    if run.micro_state is None or run.accum_steps == 1:
        return 0
    known = _known(run)
    count = 0
    for i in range(run.updates):
        span = run.window(i)
        rows = int(known[span.start : span.stop].sum()) + (_window_start(run, i) is not None)
        count += rows >= 2
    return count


def _known(run: Run) -> np.ndarray:
    if run.micro_state_known is None:
        return np.ones(run.micro_steps, dtype=bool)
    return run.micro_state_known


def _window_start(run: Run, update: int) -> np.ndarray | None:
    if update == 0:
        return run.init_state
    if run.update_state is None:
        return None
    if run.update_state_known is not None and not run.update_state_known[update - 1]:
        return None
    return run.update_state[update - 1]


def _watched(run: Run, exempt: frozenset[str]) -> np.ndarray:
    """bool [P]: the tensors whose changes inside a window are steps (parameters not exempt)."""
    return np.array([t.kind == "param" and t.name not in exempt for t in run.tensors])


def changes_in_window(run: Run, update: int, exempt: frozenset[str] = frozenset()) -> int:
    """How many times the parameters changed inside window `update`: between its start and its
    first known row, and between consecutive known rows (changes between two rows apart count
    once). One optimizer step makes one such change at most."""
    if run.micro_state is None:
        return 0
    known = _known(run)
    params = _watched(run, exempt)
    rows = [run.micro_state[m] for m in run.window(update) if known[m]]
    start = _window_start(run, update)
    if start is not None:
        rows.insert(0, start)
    return sum(bool(((b != a) & params).any()) for a, b in itertools.pairwise(rows))
