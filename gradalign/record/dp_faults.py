"""Known data-parallel bugs, injected into the built-in loop under `--nproc W` (W >= 2) to prove
the judge names them. Each is a `Fault` whose `dp` field names the deviation that
`record/parallel.py` makes; the judge never reads it. Torch-free, like `faults.py`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..config import TrainConfig

if TYPE_CHECKING:
    from .faults import Fault

LOSS_SUM = "loss-sum"
LOSS_DOUBLE_MEAN = "loss-double-mean"
LOCAL_ITEMS = "local-items"
SYNC_AFTER_FORWARD = "sync-after-forward"
UNSYNCED_PARAMS = "unsynced-params"
RANK_INIT = "rank-init"
SCHEDULER_PER_RANK = "scheduler-per-rank"
SAME_ROWS = "same-rows"
BATCHNORM_PER_RANK = "batchnorm-per-rank"


def _needs_ranks(c: TrainConfig) -> str | None:
    return None if c.nproc >= 2 else "needs data parallel: --nproc 2 or more"


def _needs_items(c: TrainConfig) -> str | None:
    if c.nproc < 2 or c.normalization != "items" or c.model != "tiny-lm":
        return "needs data parallel (--nproc 2) and item counts that differ (--model tiny-lm)"
    return None


def _needs_schedule(c: TrainConfig) -> str | None:
    if c.scheduler == "constant" and c.warmup_updates == 0:
        return "needs a scheduler (--scheduler linear|cosine or --warmup-updates)"
    return _needs_ranks(c)


def _needs_batchnorm(c: TrainConfig) -> str | None:
    if c.model != "cnn-bn":
        return "needs a model with BatchNorm (--model cnn-bn)"
    return _needs_ranks(c)


def dp_faults() -> dict[str, Fault]:
    """The data-parallel faults, by name."""
    from .faults import Fault

    faults = (
        Fault(
            "dp-loss-sum",
            "each rank's loss multiplied by W: the cards' losses summed on top of DDP's mean",
            "dp-loss-reduction",
            dp=LOSS_SUM,
            needs=_needs_ranks,
        ),
        Fault(
            "dp-loss-double-mean",
            "each rank's loss divided by W on top of DDP's mean over the ranks",
            "dp-loss-reduction",
            dp=LOSS_DOUBLE_MEAN,
            needs=_needs_ranks,
        ),
        Fault(
            "dp-token-normalization",
            "each rank divides its window's summed loss by its own item count, not all ranks'",
            "dp-token-normalization",
            dp=LOCAL_ITEMS,
            needs=_needs_items,
        ),
        Fault(
            "dp-sync-after-forward",
            "the sync flag set after the last micro-step's forward: that window is not reduced",
            "replicas-diverged",
            dp=SYNC_AFTER_FORWARD,
            needs=_needs_ranks,
        ),
        Fault(
            "dp-unsynced-params",
            "the last layer's parameters are never synced (as with find_unused_parameters and "
            "no_sync before torch 2.4, pytorch #69031)",
            "replicas-diverged",
            dp=UNSYNCED_PARAMS,
            needs=_needs_ranks,
        ),
        Fault(
            "dp-rank-init",
            "ranks other than 0 re-initialize their weights after DDP's broadcast",
            "replicas-diverged",
            dp=RANK_INIT,
            needs=_needs_ranks,
        ),
        Fault(
            "scheduler-per-rank",
            "the scheduler steps once per rank per update (accelerate without split_batches)",
            "scheduler-per-rank",
            dp=SCHEDULER_PER_RANK,
            needs=_needs_schedule,
        ),
        Fault(
            "dp-sampler",
            "no DistributedSampler: every rank reads the same rows",
            "dp-sampler",
            dp=SAME_ROWS,
            needs=_needs_ranks,
        ),
        Fault(
            "dp-batchnorm",
            "BatchNorm statistics per rank (no SyncBatchNorm)",
            "dp-batchnorm",
            dp=BATCHNORM_PER_RANK,
            needs=_needs_batchnorm,
        ),
    )
    return {fault.name: fault for fault in faults}
