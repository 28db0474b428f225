"""Notes on the runs themselves, beside the verdict: a log's printed window mean that disagrees
with its micro losses, two runs that are one run twice, a forward that writes the weights."""

from __future__ import annotations

import numpy as np

from ..runs.model import Run
from .distributed import listed

EPS32 = float(np.finfo(np.float32).eps)


def run_notes(base: Run, merged: Run, merged_loss: np.ndarray) -> list[str]:
    notes: list[str] = []
    printed = merged.printed_window_loss
    if printed is not None:
        own = merged.printed_window_quantum
        own = np.zeros_like(printed) if own is None else np.nan_to_num(own)
        # the script's own mean is a float32 sum, printed: its rounding and both print resolutions
        rounding = (merged.accum_steps + 2) * EPS32 * np.abs(merged_loss)
        slack = own + merged.window_loss_quantum() + rounding
        gaps = np.abs(printed - merged_loss)
        for i in np.flatnonzero(np.isfinite(printed) & ~(gaps <= slack)):
            notes.append(
                f"update {int(i)}: the log's printed window mean {printed[i]:.8g} "
                f"disagrees with the mean of its micro losses {merged_loss[i]:.8g}; "
                "the computed mean is used"
            )
    if _identical(base, merged):
        notes.append(
            "the two runs are bit-identical (losses and weight fingerprints): a run compared "
            "with a copy of itself passes by construction; check that the merged run is the one "
            "you meant"
        )
    return notes


def written_note(written: frozenset[str], base: Run) -> list[str]:
    if not written:
        return []
    names = listed(sorted(written), 3)
    steps = base.optimizer_steps
    unseen = (
        "; the optimizer given to the Recorder never stepped, yet the weights changed: give it "
        "the one that steps them (with one optimizer per parameter stepped in a backward hook, "
        "any one of them)"
        if steps is not None and len(steps) and not steps.any()
        else ""
    )
    return [
        f"the baseline's own forward or backward writes {names} (e.g. an Embedding with "
        "max_norm; or an optimizer whose step() evaluates the closure, micro-steps and all, "
        "several times, as LBFGS): their changes inside the merged run's windows are not "
        f"taken for optimizer steps{unseen}"
    ]


def _identical(base: Run, merged: Run) -> bool:
    if base.accum_steps != merged.accum_steps or base.update_state is None:
        return False
    same_states = merged.update_state is not None and np.array_equal(
        base.update_state, merged.update_state
    )
    return same_states and np.array_equal(base.micro_loss, merged.micro_loss, equal_nan=True)
