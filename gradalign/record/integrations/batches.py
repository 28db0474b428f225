"""What every integration takes from a framework's batch: its tensors, the mask that leaves
padding out of the sample digest, and the number of items its loss is averaged over."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from ...errors import BadInput, shown
from .. import checks

IGNORE_INDEX = -100  # the label value every framework's cross entropy ignores
PAD = (0, IGNORE_INDEX)  # integer values left out of the digest (0 adds nothing to it anyway)

ItemsRule = str | Callable[[Any], Any] | None
ITEMS_RULES = {
    "causal-lm": "labels[..., 1:] != -100: the tokens a causal LM predicts (it shifts its labels)",
    "labels": "labels != -100: the labels of a loss that does not shift them",
    "samples": "the batch's rows",
}


def tensors(batch: Any) -> Any:
    """The batch with everything that is not a tensor left out (token strings, ids, metadata)."""
    if isinstance(batch, torch.Tensor):
        return batch
    if isinstance(batch, Mapping):
        return {k: tensors(v) for k, v in batch.items() if _holds_tensors(v)}
    if isinstance(batch, list | tuple):
        return [tensors(v) for v in batch if _holds_tensors(v)]
    return []


# Made from `labels` by the collator (DataCollatorForSeq2Seq(model=...) shifts them right):
# its width follows the micro-batch's longest labels, so a row whose labels fill its micro-batch
# shows its last token only in the wider batch of B, at a position no label reads. The labels
# carry the same samples.
DERIVED_FROM_LABELS = ("decoder_input_ids",)


def digested(batch: Any) -> Any:
    """The batch's tensors whose digest names its samples: `tensors`, less those derived from
    its labels where it holds them (`DERIVED_FROM_LABELS`), and the labels flattened so that
    the attention mask, the inputs', never masks them (a seq2seq batch's targets, padded with
    -100, are as wide as its sources now and then: the mask then cut real labels in one
    width and not in another); the digest is order-free, so flat labels digest alike."""
    found = tensors(batch)
    if not isinstance(found, Mapping) or not isinstance(found.get("labels"), torch.Tensor):
        return found
    kept = {k: v for k, v in found.items() if k not in DERIVED_FROM_LABELS}
    return {**kept, "labels": kept["labels"].reshape(-1)}


def _holds_tensors(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return True
    if isinstance(value, Mapping):
        return any(_holds_tensors(v) for v in value.values())
    if isinstance(value, list | tuple):
        return any(_holds_tensors(v) for v in value)
    return False


def attention_mask(batch: Any) -> torch.Tensor | None:
    """A batch's `attention_mask` (a dict batch, as tokenizers and collators make them)."""
    mask = batch.get("attention_mask") if isinstance(batch, Mapping) else None
    return mask if isinstance(mask, torch.Tensor) else None


def labels(batch: Any) -> torch.Tensor | None:
    """A batch's labels: its `labels` entry, or the last tensor of an (inputs, targets) pair."""
    if isinstance(batch, Mapping):
        found = batch.get("shift_labels", batch.get("labels"))
        return found if isinstance(found, torch.Tensor) else None
    if isinstance(batch, list | tuple) and batch and isinstance(batch[-1], torch.Tensor):
        return batch[-1]
    return None


def check_items_rule(rule: ItemsRule) -> None:
    """Refuse an items rule that is neither a name in ITEMS_RULES, a callable nor None."""
    if rule is None or callable(rule) or rule in ITEMS_RULES:
        return
    raise BadInput(
        f"items must be one of {', '.join(ITEMS_RULES)}, a function of the batch, or None; "
        f"got {shown(rule)}"
    )


def count_items(batch: Any, rule: ItemsRule) -> float | None:
    """The items a micro-batch's loss is averaged over, by `rule` (see ITEMS_RULES), or None."""
    if rule is None:
        return None
    if callable(rule):
        return checks.count_of_items(rule(batch), "the items function's result")
    if rule == "samples":
        first = next(iter(_flat(tensors(batch))), None)
        if first is None:
            raise BadInput("items='samples' needs a batch that holds a tensor")
        return float(first.shape[0])
    found = labels(batch)
    if found is None:
        raise BadInput(f"items={rule!r} needs a batch with labels (a 'labels' entry)")
    if rule == "causal-lm" and not (isinstance(batch, Mapping) and "shift_labels" in batch):
        found = found[..., 1:]
    return float((found != IGNORE_INDEX).sum())


def _flat(batch: Any) -> list[torch.Tensor]:
    if isinstance(batch, torch.Tensor):
        return [batch]
    values = batch.values() if isinstance(batch, Mapping) else batch
    return [t for v in values for t in _flat(v)]
