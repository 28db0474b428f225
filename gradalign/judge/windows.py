"""The inside-window check: with accumulation, weights may change only at a window's last step."""

from __future__ import annotations

import numpy as np

from ..runs.model import Run


def inside_window_changes(run: Run) -> dict[int, list[str]]:
    """Per update, the micro-steps that saw weights other than those the window started from.

    Micro-step m's fingerprint is the weights it computed with. Every micro-step of window i must
    see the weights after update i-1 (the initial weights for i=0); a source that could not observe
    a row (a log has no initial weights) falls back to the first observed row of the window.
    Only parameters count: buffers such as BatchNorm's running statistics change in forward.
    """
    if run.micro_state is None or run.accum_steps == 1:
        return {}
    known = run.micro_state_known
    if known is None:
        known = np.ones(run.micro_steps, dtype=bool)
    params = np.array([t.kind == "param" for t in run.tensors])
    names = [t.name for t in run.tensors]
    found: dict[int, list[str]] = {}
    for i in range(run.updates):
        window = run.window(i)
        reference = _window_start(run, i)
        if reference is None:
            seen = [m for m in window if known[m]]
            if not seen:
                continue
            reference = run.micro_state[seen[0]]
        for m in window:
            if not known[m]:
                continue
            changed = np.flatnonzero((run.micro_state[m] != reference) & params)
            if changed.size:
                found.setdefault(i, []).append(
                    f"weights changed before micro-step {m} (position {m - window.start + 1} "
                    f"of {len(window)}), "
                    f"first in {names[changed[0]]}: an optimizer step inside the window"
                )
                break
    return found


def _window_start(run: Run, update: int) -> np.ndarray | None:
    if update == 0:
        return run.init_state
    return None if run.update_state is None else run.update_state[update - 1]
