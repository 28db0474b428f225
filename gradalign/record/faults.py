"""Known gradient-accumulation bugs, injected on purpose into the built-in loop to prove the gate
can fail. The judge never reads a fault's name: it must find the bug in the recorded numbers.

This catalogue does not import torch (the CLI's help lists the faults); the loop applies them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..config import TrainConfig
from ..errors import BadInput
from .dp_faults import dp_faults

if TYPE_CHECKING:
    import torch


def _as_is(loss: torch.Tensor, k: int) -> torch.Tensor:
    return loss


@dataclass(frozen=True)
class Fault:
    """How one bug changes the loop. The default instance is the correct loop."""

    name: str = "none"
    summary: str = "the correct loop"
    code: str | None = None  # the diagnosis that must name it
    # what backward() gets, from the correctly normalized micro loss (mean / K, or sum / items)
    scale: Callable[[torch.Tensor, int], torch.Tensor] = _as_is
    zero_grad_each_micro: bool = False
    step_each_micro: bool = False
    count_each_micro: bool = False  # the optimizer's own step count advanced per micro-step
    scheduler_each_micro: bool = False
    clip_each_micro: bool = False
    clip_over_k: bool = False  # clip_grad_norm_(max_norm / K) on the accumulated gradient
    shuffle_micro_batches: bool = False
    reseed_each_micro: bool = False
    accumulate_in: str | None = None  # dtype of a low-precision gradient accumulation buffer
    keep_grads: bool = False  # optimizer.zero_grad() never called
    penalty_each_micro: bool = False  # the L2 penalty added to every micro loss without 1/K
    unscale_each_micro: bool = False  # GradScaler.unscale_() and update() every micro-step
    skip_last_backward: bool = False  # the window's last micro-batch forwarded, not backpropagated
    edit_weights_each_micro: bool = False  # weights changed inside the window (not by a step)
    lr_times_k: bool = False  # the merged optimizer built with lr·K
    record_scaled_loss: bool = False  # the recorded micro loss is the one divided by K
    forget_update: bool = False  # Recorder.update() not called after window 1
    clamp_hook: bool = False  # a hook clamps every backward's gradient (each micro-batch's)
    dp: str | None = None  # a data-parallel deviation (dp_faults.py), read by record/parallel.py
    needs: Callable[[TrainConfig], str | None] = lambda config: None  # why it cannot show

    def scheduler_steps(self, k: int) -> int:
        """scheduler.step() calls per update."""
        return k if self.scheduler_each_micro else 1

    def micro_order(self, config: TrainConfig) -> list[int]:
        """Which micro-batch of the data each micro-step reads (in order, when correct)."""
        count = config.updates * config.accum_steps
        if not self.shuffle_micro_batches:
            return list(range(count))
        return [int(i) for i in np.random.default_rng(config.seed + 1).permutation(count)]


def _needs_scheduler(c: TrainConfig) -> str | None:
    if c.scheduler == "constant" and c.warmup_updates == 0:
        return "needs a scheduler (--scheduler linear|cosine or --warmup-updates)"
    return None


def _needs_clipping(c: TrainConfig) -> str | None:
    return None if c.clip_norm is not None else "needs clipping (--clip-norm) that engages"


def _needs_penalty(c: TrainConfig) -> str | None:
    if c.l2_penalty <= 0 or c.normalization != "mean":
        return "needs an L2 penalty (--l2-penalty) and loss_norm mean"
    return None


def _needs_scaler(c: TrainConfig) -> str | None:
    return None if c.compute == "fp16" else "needs a GradScaler (--precision fp16)"


def _needs_dropout(c: TrainConfig) -> str | None:
    if c.model != "mlp-dropout" or c.dropout == 0:
        return "needs a model with dropout (--model mlp-dropout)"
    return None


NONE = Fault()
FAULTS: dict[str, Fault] = {
    f.name: f
    for f in (
        Fault(
            "no-loss-scale",
            "each micro loss is backpropagated without dividing by K",
            "loss-scale",
            scale=lambda loss, k: loss * k,
        ),
        Fault(
            "double-loss-scale",
            "each micro loss is divided by K twice",
            "loss-scale",
            scale=lambda loss, k: loss / k,
        ),
        Fault(
            "loss-plus-scaled",
            "loss += loss / K: each micro loss is backpropagated as (1 + 1/K) times itself",
            "loss-scale",
            scale=lambda loss, k: loss * (k + 1),
        ),
        Fault(
            "zero-grad-every-micro",
            "optimizer.zero_grad() at the start of every micro-step",
            "zero-grad-in-window",
            zero_grad_each_micro=True,
        ),
        Fault(
            "step-every-micro",
            "optimizer.step() after every micro-step",
            "step-in-window",
            step_each_micro=True,
        ),
        Fault(
            "count-every-micro",
            "the optimizer's own step count (Adam's t) advanced at every micro-step; step() once",
            "step-count",
            count_each_micro=True,
            needs=lambda c: None if c.optimizer != "sgd" else "needs Adam or AdamW (--optimizer)",
        ),
        Fault(
            "scheduler-every-micro",
            "scheduler.step() once per micro-step instead of once per update",
            "lr-schedule",
            scheduler_each_micro=True,
            needs=_needs_scheduler,
        ),
        Fault(
            "clip-every-micro",
            "clip_grad_norm_() after every micro-step's backward, on the partial sum",
            "clip-per-micro",
            clip_each_micro=True,
            needs=_needs_clipping,
        ),
        Fault(
            "clip-norm-over-k",
            "clip_grad_norm_() once per update, with max_norm divided by K",
            "clip-threshold",
            clip_over_k=True,
            needs=_needs_clipping,
        ),
        Fault(
            "data-order",
            "the merged run reads the micro-batches in a shuffled order",
            "data-order",
            shuffle_micro_batches=True,
        ),
        Fault(
            "bf16-accum",
            "micro-batch gradients are accumulated in a bfloat16 buffer",
            "grad-accum-dtype",
            accumulate_in="bfloat16",
        ),
        Fault(
            "no-zero-grad",
            "optimizer.zero_grad() never called: gradients carry over into the next window",
            "grad-not-cleared",
            keep_grads=True,
        ),
        Fault(
            "penalty-every-micro",
            "the L2 penalty added to every micro loss without dividing it by K",
            "penalty-not-scaled",
            penalty_each_micro=True,
            needs=_needs_penalty,
        ),
        Fault(
            "scaler-every-micro",
            "GradScaler.unscale_() and update() called after every micro-step",
            "scaler-per-micro",
            unscale_each_micro=True,
            needs=_needs_scaler,
        ),
        Fault(
            "skip-last-backward",
            "the window's last micro-batch is forwarded but not backpropagated",
            "micro-batch-missing",
            skip_last_backward=True,
        ),
        Fault(
            "edit-weights-every-micro",
            "the weights are changed inside the window (a decay applied every micro-step)",
            "weights-changed-in-window",
            edit_weights_each_micro=True,
        ),
        Fault(
            "lr-times-k",
            "the merged optimizer is built with lr·K (a batch-size scaling rule misapplied)",
            "lr-scaled",
            lr_times_k=True,
        ),
        Fault(
            "log-scaled-loss",
            "the loss recorded for each micro-batch is the one already divided by K",
            "loss-averaging",
            record_scaled_loss=True,
        ),
        Fault(
            "forget-update",
            "the loop forgets Recorder.update() after window 1: two windows are recorded as one",
            "window-bookkeeping",
            forget_update=True,
            needs=lambda c: None if c.updates >= 3 else "needs at least 3 updates",
        ),
        Fault(
            "clamp-hook",
            "a hook on every parameter (register_hook) clamps each backward's gradient to half "
            "its largest magnitude: each micro-batch's gradient, not the window's",
            "grad-hooks",
            clamp_hook=True,
        ),
        Fault(
            "dropout-reseed",
            "the random generator is reseeded before every micro-step",
            "dropout-rng",
            reseed_each_micro=True,
            needs=_needs_dropout,
        ),
    )
}
FAULTS.update(dp_faults())


def get_fault(name: str | None, config: TrainConfig) -> Fault:
    """The named fault, checked against the config it must show up in."""
    if name is None or name == NONE.name:
        return NONE
    if name not in FAULTS:
        raise BadInput(f"unknown fault {name!r} (known: {', '.join(FAULTS)})")
    fault = FAULTS[name]
    if config.accum_steps < 2 and fault.dp is None:
        raise BadInput(f"fault {name} needs accumulation: K must be at least 2")
    reason = fault.needs(config)
    if reason:
        raise BadInput(f"fault {name} {reason}")
    return fault
