"""Copies of live tensors for the background writer: one copy each, into reused buffers.

On the CPU a snapshot is one memory copy into a numpy buffer taken from a small pool (fresh
buffers would pay the page faults of a new allocation every update). On CUDA the copy goes
asynchronously into pinned host buffers, and the writer waits for its event before reading, so
the training loop never waits for the device. bfloat16 is widened to float32 by the copy itself
(numpy has no bfloat16; the widening is exact).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

KEEP = 4  # free buffer sets kept per layout


@dataclass
class Snapshot:
    """Host copies, a wait for the copy to land (None: it has), and the buffers' return."""

    arrays: dict[str, np.ndarray]
    ready: Callable[[], None] | None
    release: Callable[[], None]


def host_dtype(tensor: torch.Tensor) -> torch.dtype:
    return torch.float32 if tensor.dtype == torch.bfloat16 else tensor.dtype


class Snapshots:
    """A pool of host buffers, one set per layout (the names, shapes and dtypes copied)."""

    def __init__(self) -> None:
        self._free: dict[tuple, list[dict[str, torch.Tensor]]] = {}
        self._lock = threading.Lock()

    def take(self, tensors: dict[str, torch.Tensor | None], shapes: dict) -> Snapshot:
        """Copy `tensors` (None: zeros of the shape and dtype `shapes[name]` gives)."""
        layout = tuple(
            (name, tuple(shapes[name][0]), shapes[name][1] if t is None else host_dtype(t))
            for name, t in tensors.items()
        )
        device = next((t.device for t in tensors.values() if t is not None), None)
        pinned = device is not None and device.type == "cuda"
        with self._lock:
            free = self._free.setdefault(layout, [])
            buffers = free.pop() if free else None
        if buffers is None:
            buffers = {
                name: torch.empty(shape, dtype=dtype, pin_memory=pinned)
                for name, shape, dtype in layout
            }
        with torch.no_grad():
            for name, tensor in tensors.items():
                if tensor is None:
                    buffers[name].zero_()
                else:
                    buffers[name].copy_(tensor.detach(), non_blocking=pinned)
        ready = None
        if pinned:
            event = torch.cuda.Event()
            event.record()
            ready = event.synchronize

        def release() -> None:
            with self._lock:
                kept = self._free.setdefault(layout, [])
                if len(kept) < KEEP:
                    kept.append(buffers)

        arrays = {name: buffers[name].numpy() for name in tensors}
        return Snapshot(arrays, ready, release)
