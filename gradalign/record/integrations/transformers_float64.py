"""The float64 reference run of a transformers model: `float64_reference(model)`.

A reference must compute the same training more precisely. `.double()` alone is not enough:
transformers' causal-LM and masked-LM losses upcast the logits with `logits.float()`, which for
a float64 model rounds them to float32, so the reference's loss would carry the baseline's own
rounding (its loss noise looks like zero, and honest merged runs fail the loss check). These are
the same losses without that cast: shift (causal LM), flatten, cross entropy, summed over
`num_items_in_batch` when the Trainer gives it, else the mean.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import nn

__all__ = ["eager_experts", "float64_reference"]


def float64_reference(model: Any) -> Any:
    """`model` cast to float64, its loss computed in float64 (causal and masked LMs), its
    mixture of experts (if any) computed by the eager loop: grouped_mm, transformers' default,
    takes no float64."""
    from transformers.loss.loss_utils import ForCausalLMLoss, ForMaskedLMLoss

    model = model.to(torch.float64)
    eager_experts(model)
    loss = getattr(model, "loss_function", None)
    if loss is ForCausalLMLoss:
        model.loss_function = causal_lm_loss
    elif loss is ForMaskedLMLoss:
        model.loss_function = masked_lm_loss
    else:
        name = getattr(loss, "__name__", type(loss).__name__)
        warnings.warn(
            f"gradalign: {type(model).__name__}'s loss ({name}) is left as transformers computes "
            "it; if it rounds to float32, the reference's loss is no more precise than the "
            "baseline's",
            stacklevel=2,
        )
    return model


def causal_lm_loss(
    logits: torch.Tensor,
    labels: torch.Tensor,
    vocab_size: int,
    num_items_in_batch: Any = None,
    ignore_index: int = -100,
    shift_labels: torch.Tensor | None = None,
    **kwargs: Any,
) -> torch.Tensor:
    """transformers' ForCausalLMLoss in the logits' own dtype."""
    if shift_labels is None:
        shift_labels = nn.functional.pad(labels, (0, 1), value=ignore_index)[..., 1:]
    return _cross_entropy(logits, shift_labels, vocab_size, num_items_in_batch, ignore_index)


def masked_lm_loss(
    logits: torch.Tensor,
    labels: torch.Tensor,
    vocab_size: int,
    num_items_in_batch: Any = None,
    ignore_index: int = -100,
    **kwargs: Any,
) -> torch.Tensor:
    """transformers' ForMaskedLMLoss in the logits' own dtype."""
    return _cross_entropy(logits, labels, vocab_size, num_items_in_batch, ignore_index)


def _cross_entropy(
    logits: torch.Tensor, targets: torch.Tensor, vocab: int, items: Any, ignore_index: int
) -> torch.Tensor:
    targets = targets.reshape(-1).to(logits.device)
    reduction = "mean" if items is None else "sum"
    loss = nn.functional.cross_entropy(
        logits.reshape(-1, vocab), targets, ignore_index=ignore_index, reduction=reduction
    )
    if items is not None:
        loss = loss / (items.to(loss.device) if torch.is_tensor(items) else items)
    return loss


def eager_experts(model: Any) -> None:
    """Experts run by transformers' eager implementation, where the model's is another (the
    same sums, one expert at a time; `grouped_mm` refuses float64 matrices)."""
    config = getattr(model, "config", None)
    chosen = getattr(config, "_experts_implementation", None)
    if chosen in (None, "eager") or not hasattr(model, "set_experts_implementation"):
        return
    model.set_experts_implementation("eager")
