"""A hand-written DDP loop with gradient accumulation, recorded through `gradalign.Recorder`.

    torchrun --standalone --nproc-per-node 2 examples/ddp_accumulation.py OUT
    gradalign compare OUT/baseline OUT/merged                        # passes
    gradalign compare OUT/baseline OUT/merged-sync-after-forward     # fails: replicas-diverged

Rank 0 first records the baseline: one process at batch B (`distributed=False`: this process
alone, though a process group is up), and its float64 rerun as the noise floor. Then every rank
trains the merged run: W ranks x K micro-batches of B/(W*K) rows, DDP averaging the gradients
once per window. Each rank creates the same Recorder; rank 0 writes the run when all have closed.
With CUDA present, each rank trains on its own GPU (LOCAL_RANK) over nccl; otherwise on the CPU
over gloo.
`merged-sync-after-forward` is the same loop with one line moved: DDP's sync flag set after the
forward instead of before it, so the last micro-step's gradients are never all-reduced.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

import gradalign

B, K, UPDATES, LR = 32, 2, 5, 0.5


def make_model(device: torch.device, dtype: torch.dtype = torch.float32) -> nn.Module:
    torch.manual_seed(3)
    return nn.Sequential(nn.Linear(12, 20), nn.Tanh(), nn.Linear(20, 2)).to(device, dtype)


def make_data(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    x = torch.randn(B * UPDATES, 12, generator=g)
    return x.to(device), (x[:, :3].sum(dim=1) > 0).long().to(device)


def baseline(
    out: Path, device: torch.device, dtype: torch.dtype, reference: str | None = None
) -> None:
    """One process at batch B: K=1."""
    model = make_model(device, dtype)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    x, y = make_data(device)
    x = x.to(dtype)
    with gradalign.Recorder(out, model, opt, 1, reference=reference, distributed=False) as rec:
        for update in range(UPDATES):
            rows = slice(update * B, (update + 1) * B)
            loss = nn.functional.cross_entropy(model(x[rows]), y[rows])
            loss.backward()
            rec.micro(loss, batch=(x[rows], y[rows]))
            opt.step()
            rec.update()
            opt.zero_grad()


def merged(out: Path, device: torch.device, sync_after_forward: bool = False) -> None:
    """W ranks x K micro-batches: rank r reads its B/(W*K) rows of each micro-step."""
    rank, world = dist.get_rank(), dist.get_world_size()
    ids = [device] if device.type == "cuda" else None
    ddp = nn.parallel.DistributedDataParallel(make_model(device), device_ids=ids)
    opt = torch.optim.SGD(ddp.parameters(), lr=LR, momentum=0.9)
    x, y = make_data(device)
    b = B // (world * K)
    with gradalign.Recorder(out, ddp, opt, accum_steps=K) as rec:
        for update in range(UPDATES):
            for micro in range(K):
                first = ((update * K + micro) * world + rank) * b
                rows = slice(first, first + b)
                sync = micro == K - 1  # all-reduce once per window, in the last backward
                if not sync_after_forward:
                    ddp.require_backward_grad_sync = sync  # before the forward: DDP reads it there
                loss = nn.functional.cross_entropy(ddp(x[rows]), y[rows])
                if sync_after_forward:
                    ddp.require_backward_grad_sync = sync  # the bug: too late for this forward
                (loss / K).backward()
                rec.micro(loss, batch=(x[rows], y[rows]))
            opt.step()
            rec.update()
            opt.zero_grad()


def main(out: Path) -> None:
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo")
    torch.set_num_threads(1)
    if dist.get_rank() == 0:
        baseline(out / "baseline-fp64", device, torch.float64)
        baseline(out / "baseline", device, torch.float32, reference="../baseline-fp64")
    merged(out / "merged", device)
    merged(out / "merged-sync-after-forward", device, sync_after_forward=True)
    dist.barrier()
    dist.destroy_process_group()
    # torch 2.13's gloo can abort in the interpreter's teardown even after a clean destroy
    # (SIGABRT, "terminate called without an active exception": 1 run in 12 to 24 of a plain
    # DDP loop with object collectives, gradalign not involved); the runs are written by now
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
