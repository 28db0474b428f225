"""What an optimizer was told, beside its learning rate: each param group's settings (betas,
eps, weight_decay, momentum...) and which group each recorded tensor is in, in the model's
order, so that two runs are compared per tensor whatever order or split their loops listed the
groups in (manifest `optimizer`, docs/FORMAT.md). Flags that choose an implementation, not the
arithmetic (`foreach`, `fused`), are left out."""

from __future__ import annotations

import math
from typing import Any

import torch

from ..runs.schema import is_int

# group entries that are not settings of the update: its tensors, its lr (a series of its own),
# and the implementation switches (the same arithmetic, to rounding)
SKIPPED = frozenset(
    {"params", "lr", "initial_lr", "foreach", "fused", "capturable", "differentiable", "name"}
)


def group_places(optimizer: torch.optim.Optimizer, places: dict[int, int]) -> list[tuple[int, int]]:
    """(place, index) of each param group in the model's order (`places`: each recorded
    tensor's id and place in the model): a group's place is its first parameter's, len(places)
    for a group of none (last). The order a loop lists its groups in (a set's, decay before
    no-decay or after) is not the training's."""
    last = len(places)
    return sorted(
        (min((places.get(id(p), last) for p in group["params"]), default=last), index)
        for index, group in enumerate(optimizer.param_groups)
    )


def group_order(optimizer: torch.optim.Optimizer, places: dict[int, int]) -> list[int]:
    """The param groups' indices in the model's order (`group_places`)."""
    return [index for _, index in group_places(optimizer, places)]


def _value(value: Any) -> Any:
    """A setting as JSON holds it (a tensor as its number, a tuple as a list), or None where it
    is none that JSON can hold exactly (a callable, an object)."""
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if isinstance(value, bool | int | str) or value is None:
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, tuple | list):
        items = [_value(v) for v in value]
        held = all(v is not None or w is None for v, w in zip(items, value, strict=True))
        return items if held else None
    return None


def settings(optimizer: torch.optim.Optimizer, places: dict[int, int]) -> dict[str, Any]:
    """`{"type", "groups": [settings per group, model order], "tensor_groups": [group per
    recorded tensor, -1 where none]}`."""
    order = group_order(optimizer, places)
    groups = []
    for index in order:
        group = optimizer.param_groups[index]
        found = {key: _value(value) for key, value in group.items() if key not in SKIPPED}
        groups.append({key: value for key, value in sorted(found.items()) if value is not None})
    tensor_groups = [-1] * len(places)
    for at, index in enumerate(order):
        for p in optimizer.param_groups[index]["params"]:
            if id(p) in places:
                tensor_groups[places[id(p)]] = at
    return {"type": type(optimizer).__name__, "groups": groups, "tensor_groups": tensor_groups}


def observed(
    known: dict[str, Any] | None, optimizer: torch.optim.Optimizer, places: dict[int, int]
) -> dict[str, Any]:
    """The settings after a step: the first step's; at the second, with the `counters` it
    moved (`with_counters`); later, as they were (a schedule that moves them is not followed)."""
    if known is None:
        return settings(optimizer, places)
    if "counters" not in known:
        return with_counters(known, settings(optimizer, places))
    return known


def with_counters(first: dict[str, Any], later: dict[str, Any]) -> dict[str, Any]:
    """The settings of the first step, with `counters`: the group entries, whole numbers, that
    another step raised (a hand-written optimizer's own step count kept in `param_groups`),
    which are state, not settings: the judge reads them as counts (`step-count`), never as
    settings the runs were given otherwise. A schedule's moves (OneCycleLR's betas, a float)
    are no count: those stay settings, compared as the first step used them."""
    changed = {
        key
        for was, now in zip(first["groups"], later["groups"], strict=False)
        for key in set(was) & set(now)
        if is_int(was[key]) and is_int(now[key]) and now[key] > was[key]
    }
    return {**first, "counters": sorted(changed)}
