"""Fixes said the way a framework's user applies them: a run recorded through the transformers
Trainer integration (its config says `framework: transformers`) never calls backward() itself,
so a wrong loss scale is fixed in what the Trainer is given, not in a training loop; on several
processes, Lightning shuffles with a sampler the loop never built, and accelerate draws a
shuffled loader's order otherwise than one process does."""

from __future__ import annotations

import dataclasses

from ..results import Comparison, Diagnosis
from .common import normalized_by_window, window

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


_TRAINER_RANKS = (
    "leave `TrainingArguments(average_tokens_across_devices=True)` (the default): the Trainer "
    "then counts num_items_in_batch over every rank and multiplies the loss by the number of "
    "processes, as DistributedDataParallel averages them"
)
_TRAINER_MEAN = (
    "; and the loss must take num_items_in_batch (here each micro-batch's mean was divided by "
    "K): give Trainer(...) a `compute_loss_func(outputs, labels, num_items_in_batch)` that "
    "returns the micro-batch's summed loss divided by num_items_in_batch"
)
_LIGHTNING_SAMPLER = (
    "; on several processes Lightning replaces a training loader's sampler with a "
    "DistributedSampler that shuffles (seed: `seed_everything`'s, else 0; set_epoch at every "
    "epoch), whatever the loader had: give the one-process baseline the same sampler "
    "(`DistributedSampler(dataset, num_replicas=1, rank=0, shuffle=True, seed=S)`, so window i "
    "holds baseline batch i), or "
    "pass your own DistributedSampler to both runs with `Trainer(use_distributed_sampler=False)`"
)


_ACCELERATE_SAMPLER = (
    "; on several processes accelerate orders a shuffled loader (`shuffle=True`) otherwise "
    "than one process does: give both runs "
    "`Accelerator(dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True))` and "
    "the same seed (`accelerate.utils.set_seed`), whose order is the same in any number of "
    "processes"
)
_SAMPLERS = {"lightning": _LIGHTNING_SAMPLER, "accelerate": _ACCELERATE_SAMPLER}
# who fills the last batch of every process from the data's start, and how its tail is dropped
_FILLS = {
    "accelerate": ("accelerate's `even_batches` (the default)", ""),
    "transformers": (
        "the Trainer's loader (accelerate's `even_batches`)",
        ": `TrainingArguments(dataloader_drop_last=True)`",
    ),
    "lightning": ("the DistributedSampler Lightning adds (its padding)", ""),
    # a loop of its own on several processes (torch.distributed)
    None: (
        "a DistributedSampler with drop_last=False (it pads the data to a multiple of the "
        "ranks with samples from its start)",
        ": DistributedSampler(..., drop_last=True), and the DataLoader's drop_last=True",
    ),
}


def for_framework(c: Comparison, found: list[Diagnosis]) -> list[Diagnosis]:
    """The diagnoses, with their fixes said for the framework that recorded the merged run: a
    Trainer user's `loss-scale` and `dp-token-normalization`, `data-order` on several
    processes."""
    framework = c.merged.config.get("framework")
    if framework == "transformers":
        found = [_trainer_fix(c, d) for d in _read_back_scaled(c, found)]
    if framework in _FILLS and c.merged.world_size > 1:
        found = [_sampler_fix(c, d, framework) if d.code == "data-order" else d for d in found]
    return found


def _read_back_scaled(c: Comparison, found: list[Diagnosis]) -> list[Diagnosis]:
    """Without `cross-sample-loss` where its loss gap is the scale `loss-scale` names: a loss the
    Trainer was told is normalized by the window's items (num_items_in_batch) is read back times
    that count, so a compute_loss_func that returned each micro-batch's mean instead recorded
    window losses about K times the baseline's, with the gradient: no loss over each micro-batch
    as a whole (16.65 against 3.82 beside a gradient 4.27 times the baseline's)."""
    named = {d.code: d.evidence for d in found}
    if "loss-scale" not in named or "cross-sample-loss" not in named:
        return found
    scale = named["loss-scale"].get("size_ratio") or named["loss-scale"].get("grad_ratio")
    gap = named["cross-sample-loss"]
    base, merged = gap.get("baseline_loss"), gap.get("merged_loss")
    if not (normalized_by_window(c.merged) and scale and base and merged):
        return found
    if abs(merged / base / scale - 1) > _READ_BACK:
        return found
    return [d for d in found if d.code != "cross-sample-loss"]


_READ_BACK = 0.25  # the loss gap within this share of the gradient's scale: the same scale


def _sampler_fix(c: Comparison, d: Diagnosis, framework: str) -> Diagnosis:
    """What the framework's sampler on several processes does that fits `data-order`: where only
    the last window holds other samples, the last batch filled from the data's start (accelerate
    and the Trainer: tests/test_integration_ranks.py; Lightning's sampler, padding 91 rows to 92
    on 2 processes: a throw-away run, not kept); else the order it reads
    (Lightning's shuffling sampler, accelerate's shuffled loader)."""
    if d.evidence.get("first_update") == c.updates - 1:
        who, drop = _FILLS[framework]
        return _with_fix(
            d,
            "; only the last window holds other samples: where the data does not fill the last "
            f"batch of every process, {who} fills it with samples from the data's start; give "
            "the data a length that is a multiple of the batch of B, or drop its tail in both "
            f"runs{drop}",
        )
    return _with_fix(d, _SAMPLERS[framework]) if framework in _SAMPLERS else d


def _with_fix(d: Diagnosis, more: str) -> Diagnosis:
    return dataclasses.replace(d, fix=(d.fix or "") + more)


def _trainer_fix(c: Comparison, d: Diagnosis) -> Diagnosis:
    if d.code == "dp-token-normalization":
        mean = c.merged.config.get("loss_normalized_by") == "micro-batch mean / K"
        return dataclasses.replace(d, fix=_TRAINER_RANKS + (_TRAINER_MEAN if mean else ""))
    if d.code != "loss-scale" or "scaled_tensors" in d.evidence:
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
