"""Hand-written DDP loops recorded with gradalign.Recorder, one variant per merged run; run by
tests/test_ddp_loops.py under `torch.distributed.run --nproc-per-node 2` (gloo, CPU), all in
one launch. Rank 0 first records the one-process baseline at batch B and its float64 rerun.

    python -m torch.distributed.run --standalone --nproc-per-node 2 tests/ddp_loops.py OUT
"""

from __future__ import annotations

import os
import sys
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

import gradalign

B, K, UPDATES, LR = 16, 2, 4, 0.3
WIDE = 1e3  # a max_norm no gradient here reaches
# each variant of the merged run: what the loop does differently from `clean`
VARIANTS = {
    "clean": {},
    "uneven-items": {"rows": (6, 2), "items": True},  # rank 0 reads 6 rows, rank 1 2: weighted
    # the window's count all-reduced but one too many: a pure scale B/(B+1), no rank reweighted
    "uneven-items-count-off": {"rows": (6, 2), "items": True, "count_off": 1},
    "uneven-mean": {"rows": (6, 2)},  # the same shards, each rank's plain mean: the bug
    # other shards at each micro-step, each micro-batch's plain mean / K: both imbalances add up
    "uneven-mean-micro": {"rows": ((6, 2), (3, 5))},
    "loss-summed": {"recorded": "sum"},  # the loss all-reduced (summed) before micro()
    "loss-times-w": {"times_w": True},  # backward of loss / K x W: DDP "sums", W = K = 2
    "fp16-hook": {"hook": "fp16"},  # DDP's fp16_compress_hook
    "powersgd-hook": {"hook": "powersgd"},  # DDP's PowerSGD hook, rank 1, from update 2
    # against baseline-clip (a GradScaler, unscale_, then clip_grad_norm_ at CLIP):
    "clip-scaler": {"clip": "after"},
    "clip-before-unscale": {"clip": "before"},  # the clip sees the scaled gradients
    "clip-each-micro": {"clip": "after", "clip_micro": True},  # and on every partial sum
    # the bug on rank 1 only: rank 0's own counts are clean (its series are the run's)
    "clip-each-micro-rank1": {"clip": "after", "clip_micro": True, "ranks": (1,)},
    "zero-grad-rank1": {"zero_grad": True, "ranks": (1,)},  # zero_grad() after micro-step 0
    "skip-last-backward": {"skip_last": True},  # the syncing micro-step forwarded, never backward
    "clip-rank1-only": {"clip": "after", "clip_ranks": (1,)},  # the window's clip on rank 1 only
    # ddp.module(x) on every rank: nothing all-reduced (on some ranks only, the others would
    # wait in their all-reduce for ever)
    "forward-module": {"around": (0, 1)},
    # clipped by hand after unscale_(), by a norm whose squares were all-reduced although DDP
    # had averaged the gradients already (√W too large); reported to grads(), or not
    "clip-hand-sqrtw": {"clip": "hand", "report": True},
    "clip-hand-sqrtw-silent": {"clip": "hand"},
    "clip-hand-per-tensor": {"clip": "hand-per-tensor"},  # each tensor by its own norm
    # no_sync() at every micro-step, each rank clipping its own gradient before the loop
    # averages the ranks' by hand: a clip of each rank's share
    "clip-before-reduce": {"clip": "local", "reduce_by_hand": True},
    # the same at a threshold no rank's share reaches (against the baseline, which clips
    # nothing): nothing engaged
    "wide-clip-before-reduce": {"clip": "local", "reduce_by_hand": True, "max_norm": WIDE},
    # each rank's norm only logged (an infinite max_norm) before the hand reduce: no clip
    "norm-logged-before-reduce": {"log_local": True, "reduce_by_hand": True},
    "sum-hook": {"hook": "sum", "k": 4},  # a comm hook that sums without dividing by W (W != K)
    "times-w-k1": {"times_w": True, "k": 1},  # W = K+1: the ranks' sum, not `loss += loss / K`
    "clip-times-w": {"clip": "after", "times_w": True, "k": 4},  # W hidden by a clip (W != K)
    # against baseline-buffer: W=2 x K=1, a running mean of each rank's own B/W input rows
    "buffer-k1": {"buffer": True, "k": 1},
    # the last window's last row on rank 1 is the data's first, as a DistributedSampler with
    # drop_last=False pads data that does not fill the ranks
    "padded-last": {"padded": True},
    # an epoch's leftover micro-step before update 2's window, its gradient cleared by zero_grad()
    "leftover-cleared": {"leftover": 2},
    # the same, cleared by hand (`p.grad = None`), which no zero_grad() call shows
    "leftover-by-hand": {"leftover": 2, "by_hand": True},
}
CLIP = 0.2
# without DDP: gradients reduced to rank 0, which steps and broadcasts its weights; `steps`
# says which ranks step (rank 1's local step, when it takes one, is then overwritten)
BROADCAST = {
    "reduce-step-broadcast": {"steps": "rank 0", "broadcast": True},
    "reduce-all-step-broadcast": {"steps": "all", "broadcast": True},
    "reduce-all-step": {"steps": "all", "broadcast": False},  # the bug: no broadcast
    "own-step-broadcast": {"steps": "all", "broadcast": True, "reduce": False},  # never reduced
    "reduce-broadcast-undivided": {"steps": "all", "broadcast": True, "undivided": True},
    # all-reduced by hand in bfloat16 (cast there and back), every rank steps
    "allreduce-bf16": {"steps": "all", "broadcast": False, "allreduce": torch.bfloat16},
}


class InputMean(nn.Module):
    """A running mean of the inputs, written by the forward (an input normalizer's statistics)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("mean", torch.zeros(8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            self.mean.mul_(0.9).add_(0.1 * x.mean(0))
        return x


def make_model(dtype: torch.dtype = torch.float32, buffer: bool = False) -> nn.Module:
    torch.manual_seed(0)
    first = [InputMean()] if buffer else []
    return nn.Sequential(*first, nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 3)).to(dtype)


def make_data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(B * UPDATES, 8, generator=g)
    return x, (x @ torch.randn(8, 3, generator=g)).argmax(dim=1)


def baseline(
    out: Path, dtype: torch.dtype, reference: str | None = None, clip: str = "", buffer=False
) -> None:
    model = make_model(dtype, buffer)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    x, y = make_data()
    x = x.to(dtype)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0) if clip else None
    kw = {"reference": reference, "distributed": False, "scaler": scaler}
    with gradalign.Recorder(out, model, opt, 1, **kw) as rec:
        for update in range(UPDATES):
            rows = slice(update * B, (update + 1) * B)
            loss = nn.functional.cross_entropy(model(x[rows]), y[rows])
            (scaler.scale(loss) if scaler else loss).backward()
            rec.micro(loss, batch=(x[rows], y[rows]))
            step(model, opt, scaler, clip)
            rec.update()
            opt.zero_grad()


def step(
    model: nn.Module,
    opt: torch.optim.Optimizer,
    scaler,
    clip: str,
    rec=None,
    max_norm: float = CLIP,
) -> None:
    """The optimizer step; with a GradScaler, clipped at `max_norm` after (or, the bug, before)
    unscale_(), or by hand (the norm handed to `rec.grads`, where given)."""
    if not scaler:
        opt.step()
        return
    if clip == "before":
        nn.utils.clip_grad_norm_(model.parameters(), CLIP)
    scaler.unscale_(opt)
    if clip == "after":
        nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    if clip == "hand":
        squares = sum(p.grad.pow(2).sum() for p in model.parameters())
        dist.all_reduce(squares)  # the bug: DDP's gradients are the ranks' mean already
        norm = squares.sqrt()
        for p in model.parameters():
            p.grad.mul_(torch.clamp(CLIP / (norm + 1e-6), max=1.0))
        if rec is not None:
            rec.grads(pre_clip_norm=norm)
    if clip == "hand-per-tensor":
        for p in model.parameters():
            p.grad.mul_(torch.clamp(CLIP / (p.grad.norm() + 1e-6), max=1.0))
    if clip == "local":  # this rank's own gradient, then the ranks' mean by hand
        nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        mean_by_hand(model)
    scaler.step(opt)
    scaler.update()


def mean_by_hand(model: nn.Module) -> None:
    """The ranks' mean gradient, all-reduced by the loop itself."""
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= dist.get_world_size()


def sum_hook(state, bucket):
    """A comm hook of the loop's own that all-reduces (sums) and forgets to divide by W."""
    future = dist.all_reduce(bucket.buffer(), async_op=True).get_future()
    return future.then(lambda done: done.value()[0])


def register_hook(ddp: nn.parallel.DistributedDataParallel, hook: str | None) -> None:
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as power

    if hook == "fp16":
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif hook == "sum":
        ddp.register_comm_hook(None, sum_hook)
    elif hook == "powersgd":
        state = power.PowerSGDState(None, matrix_approximation_rank=1, start_powerSGD_iter=2)
        ddp.register_comm_hook(state, power.powerSGD_hook)


def merged(out: Path, variant: dict) -> None:
    """W ranks x K micro-steps; no_sync() around the first K-1 (forward and backward)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    k = variant.get("k", K)
    ddp = nn.parallel.DistributedDataParallel(make_model(buffer=variant.get("buffer", False)))
    register_hook(ddp, variant.get("hook"))
    opt = torch.optim.SGD(ddp.parameters(), lr=LR, momentum=0.9)
    x, y = make_data()
    rows_of = variant.get("rows") or (B // (world * k),) * world
    per_micro = rows_of if isinstance(rows_of[0], tuple) else (rows_of,) * k
    clip = variant.get("clip", "")
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0) if clip else None
    with gradalign.Recorder(out, ddp, opt, accum_steps=k, scaler=scaler) as rec:
        for update in range(UPDATES):
            if variant.get("leftover") == update:  # backpropagated, recorded, then cleared
                with ddp.no_sync():
                    rows = slice(rank, B * UPDATES, 7)
                    nn.functional.cross_entropy(ddp(x[rows]), y[rows]).backward()
                rec.micro(torch.tensor(1.0), batch=(x[rows], y[rows]))
                for p in ddp.parameters() if variant.get("by_hand") else ():
                    p.grad = None
                if not variant.get("by_hand"):
                    opt.zero_grad()
            for micro in range(k):
                sizes = per_micro[micro]
                first = update * B + micro * (B // k) + sum(sizes[:rank])
                rows = slice(first, first + sizes[rank])
                if variant.get("padded") and (update, micro, rank) == (UPDATES - 1, k - 1, 1):
                    rows = [*range(first, first + sizes[rank] - 1), 0]  # type: ignore[assignment]
                by_hand = variant.get("reduce_by_hand")
                with ddp.no_sync() if micro < k - 1 or by_hand else nullcontext():
                    forward = ddp.module if rank in variant.get("around", ()) else ddp
                    out_ = forward(x[rows])
                    total = nn.functional.cross_entropy(out_, y[rows], reduction="sum")
                    loss = total / sizes[rank]
                    if variant.get("items"):  # its share of the window's B rows; DDP divides by W
                        (total * world / (B + variant.get("count_off", 0))).backward()
                    elif not (variant.get("skip_last") and micro == k - 1):
                        back = loss / k * (world if variant.get("times_w") else 1)
                        (scaler.scale(back) if scaler else back).backward()
                    buggy = rank in variant.get("ranks", range(world))
                    if variant.get("clip_micro") and micro < k - 1 and buggy:  # before unscale_()
                        nn.utils.clip_grad_norm_(ddp.parameters(), CLIP)
                recorded = loss.detach().clone()
                if variant.get("recorded") == "sum":
                    dist.all_reduce(recorded)
                items = {"items": sizes[rank]} if variant.get("items") else {}
                rec.micro(recorded, batch=(x[rows], y[rows]), **items)
                if variant.get("zero_grad") and micro < k - 1 and buggy:
                    opt.zero_grad()  # the gradient accumulated so far is lost
            if variant.get("log_local"):  # this rank's norm logged, then the mean by hand
                nn.utils.clip_grad_norm_(ddp.parameters(), float("inf"))
                mean_by_hand(ddp)
            clips = rank in variant.get("clip_ranks", range(world))
            report = rec if variant.get("report") else None
            step(ddp, opt, scaler, clip if clips else "", report, variant.get("max_norm", CLIP))
            rec.update()
            opt.zero_grad()


def reduce_and_broadcast(out: Path, variant: dict) -> None:
    """Each rank accumulates its rows; at the window's end the gradients are reduced to rank 0
    (averaged there), and the ranks in `steps` step; then rank 0's weights are broadcast."""
    rank, world = dist.get_rank(), dist.get_world_size()
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    x, y = make_data()
    n = B // (world * K)
    with gradalign.Recorder(out, model, opt, accum_steps=K) as rec:
        for update in range(UPDATES):
            for micro in range(K):
                first = update * B + micro * (B // K) + rank * n
                rows = slice(first, first + n)
                loss = nn.functional.cross_entropy(model(x[rows]), y[rows])
                (loss if variant.get("undivided") else loss / K).backward()
                rec.micro(loss.detach(), batch=(x[rows], y[rows]))
            for p in model.parameters() if variant.get("reduce", True) else ():
                if "allreduce" in variant:
                    sent = p.grad.to(variant["allreduce"])
                    dist.all_reduce(sent)
                    p.grad.copy_(sent)
                else:
                    dist.reduce(p.grad, dst=0)
                p.grad /= world
            if rank == 0 or variant["steps"] == "all":
                opt.step()
            if variant["broadcast"]:
                with torch.no_grad():
                    for p in model.parameters():
                        dist.broadcast(p, src=0)
            rec.update()
            opt.zero_grad()


def recorder_on_rank_0_alone(out: Path) -> None:
    """`if rank == 0: Recorder(...)`: rank 0 waits for the other ranks' Recorders at most
    GRADALIGN_JOIN_TIMEOUT seconds, then says so (in a group of its own, left unused after)."""
    group = dist.new_group(backend="gloo")
    if dist.get_rank() != 0:
        return
    model = nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    os.environ["GRADALIGN_JOIN_TIMEOUT"] = "2"
    try:
        gradalign.Recorder(out, model, optimizer, K, group=group)
    except gradalign.RecorderError as exc:
        out.with_suffix(".txt").write_text(str(exc))
    finally:
        del os.environ["GRADALIGN_JOIN_TIMEOUT"]


def main(out: Path) -> None:
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    if dist.get_rank() == 0:
        baseline(out / "baseline-fp64", torch.float64)
        baseline(out / "baseline", torch.float32, reference="../baseline-fp64")
        baseline(out / "baseline-clip-fp64", torch.float64, clip="after")
        baseline(out / "baseline-clip", torch.float32, "../baseline-clip-fp64", clip="after")
        baseline(out / "baseline-buffer", torch.float32, buffer=True)
    for name, variant in VARIANTS.items():
        merged(out / name, variant)
    for name, variant in BROADCAST.items():
        reduce_and_broadcast(out / name, variant)
    recorder_on_rank_0_alone(out / "rank0-alone")
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)  # torch 2.13's gloo can abort in teardown (examples/ddp_accumulation.py)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
