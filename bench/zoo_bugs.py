"""The bugs the model zoo (bench/model_zoo.py) injects into a merged loop, each with the code
that must name it, what it needs of the loop, and the helpers that make it."""

from __future__ import annotations

import torch

BUGS = {  # a bug the merged loop may carry -> the code that must name it
    "no-loss-scale": "loss-scale",
    "zero-grad-every-micro": "zero-grad-in-window",
    "step-every-micro": "step-in-window",
    "no-zero-grad": "grad-not-cleared",
    "mean-over-k": "token-normalization",  # --uneven: each micro-batch's mean over K
    "lr-times-k": "lr-scaled",  # every learning rate times K from the bug's update on
    "scheduler-every-micro": "lr-schedule",  # --schedule: the scheduler stepped K times a window
    "skip-last-backward": "micro-batch-missing",  # the last micro-batch forwarded, no backward
    "edit-weights-every-micro": "weights-changed-in-window",  # w *= 1 - 1e-3 between micro-steps
    "count-every-micro": "step-count",  # the optimizer's own step count advanced K times
    "data-order": "data-order",  # the micro-batches read in a shuffled order from the bug on
    "clip-every-micro": "clip-per-micro",  # --clip: every partial sum clipped, then the window
    "clip-norm-over-k": "clip-threshold",  # --clip: the window clipped at max_norm / K
    "penalty-every-micro": "penalty-not-scaled",  # --penalty: the L2 term not divided by K
    "scaler-every-micro": "scaler-per-micro",  # --autocast float16: unscale_/update per micro
    "bf16-accum": "grad-accum-dtype",  # the running sum of gradients rounded to bfloat16
    "log-scaled-loss": "loss-averaging",  # the loss recorded is the one divided by K
}
# the optimizers whose step depends on their own step count (count-every-micro shows only there)
STEP_COUNTED = {"adam-1e-2", "adam-1e-3", "adamw-wd", "adam-eps6", "nadam", "radam", "adamax",
                "adafactor", "adafactor-eps", "lamb", "lamb-eps12"}  # fmt: skip


def unmet(bug: str | None, args) -> str | None:
    """Why `bug` cannot show in the loop `args` describes (None: it can)."""
    needs = {
        "mean-over-k": (args.uneven, "--uneven (with equal micro-batches it is right)"),
        "scheduler-every-micro": (args.schedule, "--schedule"),
        "data-order": (not args.uneven, "equal micro-batches: not --uneven"),
        "clip-every-micro": (args.clip is not None, "--clip"),
        "clip-norm-over-k": (args.clip is not None, "--clip"),
        "penalty-every-micro": (args.penalty > 0, "--penalty"),
        "scaler-every-micro": (args.autocast == "float16", "--autocast float16"),
        # a GradScaler's unscale_ divides the carried gradient by the scale (65536) each window:
        # 1.5e-5 of a gradient, far below float16's noise (Rprop runs 186600-186613 all passed)
        "no-zero-grad": (args.autocast != "float16", "no --autocast float16"),
        "count-every-micro": (
            not set(args.optimizers.split(",")) - STEP_COUNTED,
            "optimizers whose step reads their step count: " + ", ".join(sorted(STEP_COUNTED)),
        ),
    }
    met, what = needs.get(bug, (True, ""))
    return None if met else f"--bug {bug} needs {what}"


def times_k(opt, sched, k: int) -> None:
    """Every learning rate times K (a batch-size scaling rule misapplied), the schedule's too."""
    for o in (getattr(opt, "optimizer", opt), getattr(opt, "rest", None)):
        for group in [] if o is None else o.param_groups:
            group["lr"] *= k
    if sched:
        sched.base_lrs = [lr * k for lr in sched.base_lrs]


def shuffled_blocks(x, y, size: int, first: int, seed: int):
    """The data's blocks of `size` rows from block `first` on in a seeded shuffled order."""
    blocks = x.shape[0] // size
    g = torch.Generator().manual_seed(7000 + seed)
    order = torch.cat([torch.arange(first), first + torch.randperm(blocks - first, generator=g)])
    rows = (order[:, None] * size + torch.arange(size)).reshape(-1)
    return x[rows], y[rows]


@torch.no_grad()
def round_grads(net: torch.nn.Module, dtype: torch.dtype = torch.bfloat16) -> None:
    """The running sum of gradients rounded to `dtype` in place (an accumulation buffer in it)."""
    for param in net.parameters():
        if param.grad is not None:
            param.grad.copy_(param.grad.to(dtype))
