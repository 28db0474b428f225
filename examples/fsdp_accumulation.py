"""Gradient accumulation under FSDP (`fully_shard`), recorded through `gradalign.Recorder`.

    torchrun --standalone --nproc-per-node 2 examples/fsdp_accumulation.py OUT [--bf16]
    gradalign compare OUT/baseline OUT/merged              # passes
    gradalign compare OUT/baseline OUT/merged-sync-each    # passes: reduced at every micro-step
    gradalign compare OUT/baseline OUT/merged-not-divided  # fails: loss-scale
    gradalign compare OUT/baseline OUT/merged-sync-never   # fails: micro-batch-missing

Rank 0 first records the baseline: one process at batch B with a plain model (`distributed=
False`), and its float64 rerun as the noise floor. Then every rank trains the merged run with each
Linear and the whole model sharded by `fully_shard`: W ranks x K micro-batches of B/(W*K) rows,
the gradient reduce-scattered once per window (`set_requires_gradient_sync` off until the last
micro-step) and clipped once per update. The parameters are DTensors: each rank holds a part, and
the Recorder gathers the whole tensors it copies, so every rank records the same run. With CUDA
present, each rank trains on its own GPU (LOCAL_RANK) over nccl; otherwise on the CPU over gloo.
`--bf16` shards with a MixedPrecisionPolicy (bfloat16 parameters in the forward, float32
reduction), the baseline too: there `fully_shard` spans rank 0 alone, so that both runs compute
at one precision.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

import gradalign

B, K, UPDATES, CLIP = 32, 2, 5, 0.5


def make_model(device: torch.device, dtype: torch.dtype = torch.float32) -> nn.Module:
    torch.manual_seed(3)
    return nn.Sequential(nn.Linear(12, 20), nn.Tanh(), nn.Linear(20, 2)).to(device, dtype)


def sharded(device: torch.device, bf16: bool, mesh: DeviceMesh | None = None) -> nn.Module:
    """Each Linear and the whole model sharded over `mesh` (default: every rank)."""
    model = make_model(device)
    policy = MixedPrecisionPolicy(torch.bfloat16, torch.float32) if bf16 else None
    how = {"mesh": mesh, **({"mp_policy": policy} if policy else {})}
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, **how)
    return fully_shard(model, **how)


def train(out: Path, model: nn.Module, k: int, *, distributed: bool = True, **how) -> None:
    """K micro-batches per update on every rank: rank r reads its B/(W*K) rows of each."""
    rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    dtype = next(model.parameters()).dtype
    g = torch.Generator().manual_seed(7)
    x = torch.randn(B * UPDATES, 12, generator=g)
    y = (x[:, :3].sum(dim=1) > 0).long()
    device = next(model.parameters()).device
    x, y = x.to(device, dtype), y.to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    b = B // (world * k)
    where = {"reference": how.get("reference"), "distributed": distributed}
    with gradalign.Recorder(out, model, opt, k, **where) as rec:
        for update in range(UPDATES):
            for micro in range(k):
                first = ((update * k + micro) * world + rank) * b
                rows = slice(first, first + b)
                if distributed and how.get("sync_never"):  # the bug: never reduce-scattered
                    model.set_requires_gradient_sync(False)
                elif distributed and not how.get("sync_each"):
                    model.set_requires_gradient_sync(micro == k - 1)  # reduce once per window
                loss = nn.functional.cross_entropy(model(x[rows]), y[rows])
                (loss if how.get("not_divided") else loss / k).backward()
                rec.micro(loss, batch=(x[rows], y[rows]))
            nn.utils.clip_grad_norm_(model.parameters(), CLIP)
            opt.step()
            rec.update()
            opt.zero_grad()


def main(out: Path, bf16: bool) -> None:
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo")
    torch.set_num_threads(1)
    alone = dist.new_group([0])  # every rank makes the group; rank 0 alone is in it
    if dist.get_rank() == 0:
        fp64 = make_model(device, torch.float64)
        train(out / "baseline-fp64", fp64, 1, distributed=False)
        one = DeviceMesh.from_group(alone, device.type) if bf16 else None
        baseline = sharded(device, bf16, one) if bf16 else make_model(device)
        train(out / "baseline", baseline, 1, distributed=False, reference="../baseline-fp64")
    train(out / "merged", sharded(device, bf16), K)
    train(out / "merged-sync-each", sharded(device, bf16), K, sync_each=True)
    train(out / "merged-not-divided", sharded(device, bf16), K, not_divided=True)
    train(out / "merged-sync-never", sharded(device, bf16), K, sync_never=True)
    dist.barrier()
    dist.destroy_process_group()
    # as in ddp_accumulation.py: torch 2.13's gloo can abort in the interpreter's teardown
    # after a clean destroy; the runs are written by now
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main(Path(sys.argv[1]), "--bf16" in sys.argv[2:])
