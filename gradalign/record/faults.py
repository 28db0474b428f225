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
    scheduler_each_micro: bool = False
    clip_each_micro: bool = False
    shuffle_micro_batches: bool = False
    reseed_each_micro: bool = False
    accumulate_in: str | None = None  # dtype of a low-precision gradient accumulation buffer
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
            "dropout-reseed",
            "the random generator is reseeded before every micro-step",
            "dropout-rng",
            reseed_each_micro=True,
            needs=_needs_dropout,
        ),
    )
}


def get_fault(name: str | None, config: TrainConfig) -> Fault:
    """The named fault, checked against the config it must show up in."""
    if name is None or name == NONE.name:
        return NONE
    if name not in FAULTS:
        raise BadInput(f"unknown fault {name!r} (known: {', '.join(FAULTS)})")
    fault = FAULTS[name]
    if config.accum_steps < 2:
        raise BadInput(f"fault {name} needs accumulation: K must be at least 2")
    reason = fault.needs(config)
    if reason:
        raise BadInput(f"fault {name} {reason}")
    return fault
