"""Parameters sharded across ranks as DTensors (FSDP's `fully_shard`, tensor parallelism): the
Recorder reads each as the whole tensor it stands for.

A DTensor's rank holds only its part. Where the Recorder copies or fingerprints a tensor, it first
gathers the whole one (`full_tensor()`, a collective every rank makes in the same order, as every
rank makes the Recorder's calls in the same order); where it only asks whether a tensor was
written (its version counter and storage), it asks the local part, which every write goes to. So
every rank records the same whole tensors, as replicas under DDP would.
"""

from __future__ import annotations

from typing import Any

import torch


def is_sharded(tensor: Any) -> bool:
    """A DTensor (checked by name: torch.distributed.tensor is not imported for this)."""
    return type(tensor).__name__ == "DTensor"


def whole(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor a DTensor stands for (a collective); any other tensor as it is."""
    return tensor.full_tensor() if is_sharded(tensor) else tensor


def local(tensor: torch.Tensor) -> torch.Tensor:
    """The part of a DTensor this rank holds, where its writes land; any other tensor itself."""
    return tensor.to_local() if is_sharded(tensor) else tensor


def any_sharded(tensors: Any) -> bool:
    return any(is_sharded(t) for t in tensors)
