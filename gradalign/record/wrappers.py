"""The wrappers a training loop may hand the Recorder around its model, peeled one at a time:
DistributedDataParallel and DataParallel (`.module`), torch.compile's (`._orig_mod`) and
Lightning Fabric's `_FabricModule` (`._forward_module`, which holds the strategy's wrapper,
DDP's under `strategy="ddp"`), in any nesting. Each wraps the same parameters."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

_DEPTH = 8  # wrappers peeled at most


def chain(model: Any) -> Iterator[Any]:
    """`model`, then each module it wraps, outermost first."""
    for _ in range(_DEPTH):
        yield model
        inner = _inner(model)
        if inner is None:
            return
        model = inner


def _inner(model: Any) -> torch.nn.Module | None:
    if isinstance(model, torch.nn.parallel.DistributedDataParallel | torch.nn.DataParallel):
        return model.module
    for attribute in ("_orig_mod", "_forward_module"):  # torch.compile's, Fabric's
        inner = getattr(model, attribute, None)
        if isinstance(inner, torch.nn.Module) and inner is not model:
            return inner
    return None


def innermost(model: torch.nn.Module) -> torch.nn.Module:
    """The module inside every wrapper: its names carry no `module.`, `_orig_mod.` or
    `_forward_module.` prefix, so runs wrapped otherwise name their tensors alike."""
    *_, last = chain(model)
    return last


def data_parallel(model: Any) -> torch.nn.parallel.DistributedDataParallel | None:
    """The DistributedDataParallel among `model`'s wrappers, if any."""
    parallel = torch.nn.parallel.DistributedDataParallel
    return next((m for m in chain(model) if isinstance(m, parallel)), None)
