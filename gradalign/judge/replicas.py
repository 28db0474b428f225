"""Data-parallel replicas: every card's printed weights must equal card 0's at every step where
both printed them (an all-reduce gives every card the same bits; cards that drift apart did not
average their gradients in some window)."""

from __future__ import annotations

import numpy as np

from ..runs.model import Run


def replica_disagreements(run: Run) -> dict[int, list[str]]:
    """Per update, the first card whose printed weights differ from card 0's within it."""
    found: dict[int, list[str]] = {}
    names = [t.name for t in run.tensors]
    for card, replica in enumerate(run.replicas, start=1):
        for i, step, column in _first_differences(run, replica):
            if i in found:
                continue
            text = (
                f"card {card}'s printed weights differ from card 0's after micro-step {step}, "
                f"first in {names[column]}"
            )
            detail = (
                _max_abs(run, replica, i, names[column])
                if step % run.accum_steps == (run.accum_steps - 1)
                else None
            )
            found[i] = [text + (f" (max abs diff {detail:.3g})" if detail is not None else "")]
    return found


def replicas_comparable(run: Run) -> int:
    """How many steps' printed weights could be compared across the cards (0: none)."""
    return len({step for replica in run.replicas for step in _printed_steps(run, replica)})


def _printed_steps(run: Run, replica: Run) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Per micro-step printed in both logs, the two fingerprint rows printed after it."""
    steps: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    k = run.accum_steps
    if run.micro_state is not None and replica.micro_state is not None:
        m = run.micro_steps
        both = _known(run.micro_state_known, m) & _known(replica.micro_state_known, m)
        for row in np.flatnonzero(both):
            if row > 0:  # row m holds what was printed after micro-step m-1
                steps[int(row) - 1] = run.micro_state[row], replica.micro_state[row]
    if run.update_state is not None and replica.update_state is not None:
        n = run.updates
        both = _known(run.update_state_known, n) & _known(replica.update_state_known, n)
        for i in np.flatnonzero(both):
            steps[(int(i) + 1) * k - 1] = run.update_state[i], replica.update_state[i]
    return dict(sorted(steps.items()))


def _first_differences(run: Run, replica: Run):
    """(update, micro-step, tensor column) of every step whose printed weights differ."""
    for step, (mine, theirs) in _printed_steps(run, replica).items():
        differ = np.flatnonzero(mine != theirs)
        if differ.size:
            yield step // run.accum_steps, step, int(differ[0])


def _known(mask: np.ndarray | None, size: int) -> np.ndarray:
    return np.ones(size, dtype=bool) if mask is None else mask


def _max_abs(run: Run, replica: Run, update: int, name: str) -> float | None:
    mine, theirs = run.weights(update), replica.weights(update)
    if mine is None or theirs is None:
        return None
    return float(np.abs(mine[name] - theirs[name]).max())
