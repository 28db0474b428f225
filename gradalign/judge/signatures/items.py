"""`batch-dependent-targets`: the same samples count other items in the merged windows than in
the baseline's batches. What a sample contributes to the loss then depends on the batch it was
put in: padding used as targets (labels copied from padded inputs, not masked), left padding
that turns a row's first real token into a target, truncation to the batch's longest sequence
(each micro-batch is padded to its own longest, so a window holds other padded targets than the
batch of B), or targets drawn at random per batch (a masked-LM collator's masks, drawn for each
micro-batch in turn). The loss is then another function of the same samples."""

from __future__ import annotations

import numpy as np

from ...runs.model import Run
from ..checks import sample_mismatches
from ..results import Comparison, Diagnosis
from ..window_sizes import judged_updates
from .common import finite


def batch_targets(c: Comparison) -> Diagnosis | None:
    """Both runs recorded items and the same samples per window, and some window counted
    other items than its baseline batch."""
    base, merged = c.baseline, c.merged
    if base.micro_items is None or merged.micro_items is None:
        return None
    other = sample_mismatches(base, merged)
    if other is None or other.size:  # unknown samples, or other ones: data-order's
        return None
    n = judged_updates(base, merged)
    mine = window_items(base)[:n]
    theirs = window_items(merged)[:n]
    whole = _whole(mine) and _whole(theirs)  # counts exact; weights summed in float32 round
    apart = np.flatnonzero(mine != theirs if whole else ~np.isclose(mine, theirs, rtol=1e-5))
    if not apart.size:
        return None
    first = int(apart[0])
    b, m = float(mine[first]), float(theirs[first])
    return Diagnosis(
        "batch-dependent-targets",
        f"{apart.size} of {n} windows count other items than their baseline batch for the same "
        f"samples (first: update {first}, {_shown(m)} items in the merged window against "
        f"{_shown(b)} in the baseline's batch): what a sample adds to the loss depends on the "
        "batch it is put in. Each micro-batch is padded to its own longest sequence, so padding "
        "that counts as a target (labels copied from padded inputs and not masked, or left "
        "padding, which makes a row's first real token a target) or truncation to the batch's "
        "longest gives a window other targets than the batch of B; so do targets drawn at "
        "random per batch (a masked-LM collator's masks, drawn for each micro-batch in turn)",
        {
            "windows_with_other_items": int(apart.size),
            "first_update": first,
            "merged_items": finite(m),
            "baseline_items": finite(b),
        },
        "make each sample's targets its own: set the label of every padded position to the "
        "ignore index (-100) and shift labels within each sequence, never across padding; or "
        "pad every batch to one fixed length on the side that holds no target; draw random "
        "targets per sample (a generator seeded by the sample) or once for the whole window",
    )


def window_items(run: Run) -> np.ndarray:
    """The items each window of `run` counted (summed over its micro-steps and ranks)."""
    return run.window_totals(run.micro_items)


def _whole(counts: np.ndarray) -> bool:
    return bool(np.all(counts == np.round(counts)))


def _shown(count: float) -> str:
    return str(int(count)) if count == int(count) else f"{count:.6g}"
