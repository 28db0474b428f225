"""The backward check: a window whose last micro-batch never reached the gradients.

The Recorder counts writes to every parameter's `.grad` at each micro-step
(`micro/grad_writes`). A window whose micro-steps after the first each wrote a gradient and
whose last wrote none forwarded its last micro-batch and never backpropagated it (a loop whose
`if micro < K - 1: loss.backward()` is one off): the window steps with K - 1 of its K
micro-batches. That is a fact of the loop, not of the numbers, so it fails the run where the
gradients pass by their tolerance (without a reference, 16-bit runs that parted are judged by
`grad_rtol_apart`, 0.3, and one micro-batch of 8 moves the gradient ~12%).

What does not fail here, being the same training: loops that write `.grad` only once per
window (gradients summed in a buffer of their own and put back before the step, or one
backward of the window's summed losses), whose middle micro-steps are silent too; a last
micro-batch recorded with 0 items (an empty one a loop skips). A window of two micro-steps has
no middle to tell the two apart and is left to the numbers. Runs that recorded fingerprints of
the gradients instead of write counts (`micro/grad_state`) are left to them too: a micro-batch
whose gradient is exactly zero leaves the same bits.
"""

from __future__ import annotations

import numpy as np

from ..runs.model import Run
from .results import FAIL, Check

NAME = "every micro-batch backpropagated"


def unbackpropagated(run: Run) -> dict[int, list[str]]:
    """Per update, the window's last micro-step that wrote no gradient, where every micro-step
    between the first and the last did (see the module's docstring)."""
    writes = run.micro_grad_writes
    if writes is None or run.accum_steps < 3:
        return {}
    params = np.array([t.kind == "param" for t in run.tensors])
    found: dict[int, list[str]] = {}
    for i in range(run.updates):
        w = run.window(i)
        if len(w) < 3 or w.stop > len(writes):
            continue
        rows = writes[w.start : w.stop][:, params]
        moved = (rows[1:] != rows[:-1]).any(axis=1)  # micro-steps 1..n-1 of the window
        empty = run.micro_items is not None and run.micro_items[w.stop - 1] == 0
        if moved[:-1].all() and not moved[-1] and rows[-1].any() and not empty:
            found[i] = [
                f"micro-step {len(w) - 1} (of {len(w)}, from 0) wrote no gradient, where each "
                "micro-step before it did"
            ]
    return found


def backprop_check(silent: dict[int, list[str]]) -> list[Check]:
    """The check, listed only when it fails (a run without the records passes it unseen)."""
    if not silent:
        return []
    first = min(silent)
    return [
        Check(NAME, FAIL, f"{len(silent)} window(s); first, update {first}: {silent[first][0]}")
    ]
