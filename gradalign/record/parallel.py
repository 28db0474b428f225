"""Data parallel inside the one training loop: what changes when the merged run is W ranks.

The loop asks its `Parallel` five things: which rows a micro-step reads, in which sync context a
micro-step runs (DDP's `no_sync()` for the first K-1 micro-steps, forward included), how to run
the forward, the window's item count over all ranks, and how often the scheduler steps. One
process answers trivially (`Parallel`); `DataParallel` wraps the model in DDP. Global micro-step
m is the rows of the single-process micro-step m, split over the ranks: rank r reads rows
`(m*W + r)*b ... (m*W + r + 1)*b - 1` with b = B/(W*K), so window i holds exactly baseline
batch i. The data-parallel faults (dp_faults.py) are small deviations here.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from .dp_faults import (
    BATCHNORM_PER_RANK,
    LOSS_DOUBLE_MEAN,
    LOSS_SUM,
    RANK_INIT,
    SAME_ROWS,
    SCHEDULER_PER_RANK,
    SYNC_AFTER_FORWARD,
    UNSYNCED_PARAMS,
)
from .faults import NONE, Fault


class Parallel:
    """One process: every hook is the identity."""

    rank, world = 0, 1

    def __init__(self, model: torch.nn.Module | None = None) -> None:
        self.module = model

    @contextlib.contextmanager
    def micro_step(self, micro: int, k: int) -> Iterator[None]:
        yield

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.module(inputs)  # type: ignore[misc]

    def block(self, index: int) -> int:
        """Which block of B/(W*K) rows micro-step `index` (global) reads on this rank."""
        return index

    def loss(self, scaled: torch.Tensor) -> torch.Tensor:
        """What backward() gets from the correctly normalized micro loss."""
        return scaled

    def window_items(self, items: float) -> float:
        """What the window's summed gradient is divided by under item normalization."""
        return items

    def scheduler_steps(self, steps: int) -> int:
        return steps


class DataParallel(Parallel):
    """This process is one of W ranks of an initialized process group; the model runs in DDP."""

    def __init__(self, model: torch.nn.Module, fault: Fault = NONE, seed: int = 0) -> None:
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel

        super().__init__(model)
        self.rank, self.world, self.fault = dist.get_rank(), dist.get_world_size(), fault.dp
        if self.fault != BATCHNORM_PER_RANK:
            model = sync_batchnorm(model)
        if self.fault == UNSYNCED_PARAMS:  # as if DDP never saw them used (pytorch #69031)
            last = [name for name, _ in model.named_parameters()][-2:]
            DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(model, last)
        device = next(model.parameters()).device
        self.ddp = DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None
        )
        self.module = model
        if self.fault == RANK_INIT and self.rank > 0:  # loaded or reset after DDP's broadcast
            torch.manual_seed(seed + 7919 * self.rank)
            for layer in model.modules():
                if layer is not model and hasattr(layer, "reset_parameters"):
                    layer.reset_parameters()
        self._last = False

    @contextlib.contextmanager
    def micro_step(self, micro: int, k: int) -> Iterator[None]:
        """No gradient sync for the first K-1 micro-steps, their forward included."""
        self._last = micro == k - 1
        with contextlib.nullcontext() if self._last else self.ddp.no_sync():
            yield

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        if self._last and self.fault == SYNC_AFTER_FORWARD:  # the flag set after the forward
            with self.ddp.no_sync():
                return self.ddp(inputs)
        return self.ddp(inputs)

    def block(self, index: int) -> int:
        return index * self.world + (0 if self.fault == SAME_ROWS else self.rank)

    def loss(self, scaled: torch.Tensor) -> torch.Tensor:
        if self.fault == LOSS_SUM:  # the cards' losses summed, on top of DDP's mean
            return scaled * self.world
        if self.fault == LOSS_DOUBLE_MEAN:  # divided by the world size, on top of DDP's mean
            return scaled / self.world
        return scaled

    def window_items(self, items: float) -> float:
        """The window's items over every rank, over W: DDP has averaged the ranks' sums."""
        import torch.distributed as dist

        device = next(self.module.parameters()).device
        total = torch.tensor([float(items)], dtype=torch.float64, device=device)
        dist.all_reduce(total)
        return float(total) / self.world

    def scheduler_steps(self, steps: int) -> int:
        return steps * self.world if self.fault == SCHEDULER_PER_RANK else steps


def sync_batchnorm(model: torch.nn.Module) -> torch.nn.Module:
    """BatchNorm over the whole global micro-batch: SyncBatchNorm on CUDA (torch's own), on the
    CPU gradalign's `RankBatchNorm` (torch's SyncBatchNorm runs on GPUs only)."""
    if not any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in model.modules()):
        return model
    if next(model.parameters()).device.type == "cuda":
        return torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
    from .syncbn import convert

    return convert(model)
