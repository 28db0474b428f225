"""Fixes said the way a framework's user applies them: a run recorded through the transformers
Trainer integration (its config says `framework: transformers`) never calls backward() itself,
so a wrong loss scale is fixed in what the Trainer is given, not in a training loop."""

from __future__ import annotations

import dataclasses

from ..results import Comparison, Diagnosis
from .common import window

_NOT_DIVIDED = (
    "the Trainer divides a micro-batch's loss by K only where the model does not take "
    "num_items_in_batch; here it passed num_items_in_batch on and the loss ignored it (each "
    "micro-batch's mean): compute the loss from it, with a "
    "`compute_loss_func(outputs, labels, num_items_in_batch)` given to Trainer(...) (or a "
    "compute_loss override, or a model whose own loss divides by num_items_in_batch) that "
    "returns the micro-batch's summed loss divided by num_items_in_batch; or set "
    "`trainer.model_accepts_loss_kwargs = False` before train(), and the Trainer divides each "
    "micro-batch's loss by gradient_accumulation_steps itself (each micro-batch's mean then "
    "weighs alike, exact only where they hold equal item counts)"
)
_DIVIDED_TWICE = (
    "do not divide the loss by gradient_accumulation_steps in compute_loss or "
    "compute_loss_func: the Trainer already scales it (it divides by K where "
    "`trainer.model_accepts_loss_kwargs` is False, else the loss is normalized by "
    "num_items_in_batch, the window's item count); return the micro-batch's loss as computed"
)
_OTHER = (
    "return from compute_loss (or compute_loss_func) the micro-batch's summed loss divided by "
    "num_items_in_batch, or its mean with `trainer.model_accepts_loss_kwargs = False` (the "
    "Trainer then divides it by gradient_accumulation_steps); scale it nowhere else"
)


def for_framework(c: Comparison, found: list[Diagnosis]) -> list[Diagnosis]:
    """The diagnoses, with `loss-scale`'s fix said for a Trainer user where the merged run was
    recorded through the transformers Trainer integration."""
    if c.merged.config.get("framework") != "transformers":
        return found
    return [_trainer_fix(c, d) if d.code == "loss-scale" else d for d in found]


def _trainer_fix(c: Comparison, d: Diagnosis) -> Diagnosis:
    if "scaled_tensors" in d.evidence:
        return d  # one term of a model's own loss scaled alone: the model's loss, not the Trainer
    k, expected = window(c), d.evidence.get("expected_ratio")
    fix = (
        _NOT_DIVIDED
        if expected == k
        else _DIVIDED_TWICE
        if expected is not None and k > 1 and abs(expected * k - 1) < 1e-9
        else _OTHER
    )
    return dataclasses.replace(d, fix=fix)
