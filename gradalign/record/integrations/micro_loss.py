"""A micro-batch's loss as an integration learns it (from the loss a framework backpropagates, or
as the user stated it), and the one call that records a micro-step from it and the batch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ...errors import BadInput
from ..recorder import Recorder
from . import batches

Number = torch.Tensor | float | int


@dataclass(frozen=True)
class MicroLoss:
    """A micro-batch's own mean `loss`, or its `loss_sum` over `items`."""

    loss: Number | None = None
    loss_sum: Number | None = None
    items: Number | None = None
    stated: bool = False  # given by the user (`record_loss`), not read off a backward

    @classmethod
    def of(cls, loss: Number | None, loss_sum: Number | None, items: Number | None) -> MicroLoss:
        """Checked: exactly one of `loss` and `loss_sum`, and `loss_sum` with its `items`."""
        if (loss is None) == (loss_sum is None):
            raise BadInput("give either loss (the micro-batch's mean) or loss_sum with items")
        if loss_sum is not None and items is None:
            raise BadInput("loss_sum needs items, the number of items it sums over")
        return cls(_detached(loss), _detached(loss_sum), items, stated=True)

    @classmethod
    def scaled_mean(cls, loss: torch.Tensor, divided_by: int) -> MicroLoss:
        """A loss that is the micro-batch's mean divided by `divided_by` (K where the framework
        divided it, as Lightning does before its backward), back as that mean."""
        return cls(loss=loss.detach().double() * divided_by)


def _detached(value: Number | None) -> Number | None:
    return value.detach() if isinstance(value, torch.Tensor) else value


def summed(losses: list[MicroLoss]) -> MicroLoss:
    """A micro-step's loss from its backward calls: what the user stated for it (`record_loss`),
    else what its backward calls received; several added (losses, or sums and their items)."""
    stated = [m for m in losses if m.stated]
    losses = stated or losses
    if len(losses) == 1:
        return losses[0]
    if all(m.loss is not None for m in losses):
        return MicroLoss(loss=sum(m.loss for m in losses))  # type: ignore[misc]
    if all(m.loss_sum is not None for m in losses):
        return MicroLoss(
            loss_sum=sum(m.loss_sum for m in losses),  # type: ignore[misc]
            items=sum(m.items for m in losses),  # type: ignore[misc]
        )
    raise BadInput(
        "a micro-step's losses were stated both as loss and as loss_sum: state them one way"
    )


def record_micro(
    recorder: Recorder,
    loss: MicroLoss,
    batch: Any,
    items: batches.ItemsRule,
    pad: Any,
) -> None:
    """One micro-step: its loss, its items (stated with the loss, else counted by `items` from
    the batch), and the digest of the batch's samples without padding."""
    count = loss.items if loss.items is not None else batches.count_items(batch, items)
    samples = {"batch": batches.digested(batch), "pad": pad, "mask": batches.attention_mask(batch)}
    items_kw = {"items": None if count is None else float(count)}
    if loss.loss_sum is not None:
        recorder.micro(loss_sum=loss.loss_sum, **items_kw, **samples)
    else:
        recorder.micro(loss.loss, **items_kw, **samples)
