"""`batch-size`: the merged window holds another count of rows than the baseline's batch, most
often each micro-batch the baseline's whole batch (`gradient_accumulation_steps` set and the
batch per step left as it was), so an update sees K times the data."""

from __future__ import annotations

from ...runs.model import Run
from ..checks import sample_mismatches
from ..results import Comparison, Diagnosis
from .common import window

# what a window of too many rows also breaks: the windows run out of data unevenly, and they
# hold other samples than the baseline's batches
FOLLOWS = {"window-bookkeeping", "data-order"}


def _rows(run: Run) -> tuple[int, int] | None:
    """The rows of the first window and of its first micro-batch on one rank (a run's
    `micro/samples` sums its ranks'); None where the run did not record them."""
    if run.micro_samples is None or not run.updates:
        return None
    first = run.window(0)
    rows = run.micro_samples[first.start : first.stop]
    if not rows.size:
        return None
    return int(rows.sum()), int(rows[0]) // run.world_size


def batch_size(c: Comparison) -> Diagnosis | None:
    """The merged run's first window holds other rows than the baseline's first batch, and
    other samples (by their digests: a leading dimension that is not the batch's, such as a
    sequence-first RNN input's time, counts alike in both runs and leaves the digests equal)."""
    base, merged = _rows(c.baseline), _rows(c.merged)
    if base is None or merged is None or base[0] == merged[0] or not base[0]:
        return None
    other = sample_mismatches(c.baseline, c.merged)
    if other is None or 0 not in other:
        return None
    k, world = window(c), c.merged.world_size
    (batch, _), (held, micro) = base, merged
    pieces = k * world
    ranks = f" on each of {world} ranks" if world > 1 else ""
    if micro in (batch, batch // world) and batch % world == 0 and k > 1:  # K left out
        share = "the baseline's whole batch" if micro == batch else f"1/{world} of its batch"
        said = (
            f"each micro-batch holds {micro} rows{ranks}, {share}, not its 1/{pieces} share: "
            f"the batch per micro-step was not divided by K={k}, so each update steps on "
            f"{held / batch:.3g} times the data"
        )
    else:
        said = (
            f"its micro-batches of {micro} rows{ranks} do not make up the batch over K={k} "
            "micro-steps" + (f" and W={world} ranks" if world > 1 else "")
        )
    return Diagnosis(
        "batch-size",
        f"the merged run's first window holds {held} rows and the baseline's batch {batch}: "
        + said,
        {"baseline_rows": batch, "merged_window_rows": held, "merged_micro_rows": micro, "K": k},
        f"give each micro-step {_share(batch, pieces)} rows, so that a window holds the baseline's "
        f"{batch}: divide the batch per step by K"
        + (" and the ranks" if world > 1 else "")
        + " (transformers: per_device_train_batch_size; Lightning and accelerate: the "
        "DataLoader's batch_size), keeping the baseline's batch as it is",
    )


def _share(rows: int, pieces: int) -> str:
    return str(rows // pieces) if rows % pieces == 0 else f"{rows}/{pieces}"
