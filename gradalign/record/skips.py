"""Skipping the optimizer's step at chosen updates, as a GradScaler skips it on overflow.

A float16 run's GradScaler skips `optimizer.step()` in a window whose scaled gradients hold an
inf or NaN (commonly the first updates, while the scale comes down from 2**16). A float64 rerun
never overflows, so it steps there and is no rerun of that training. Its Recorder takes the
baseline's skipped updates (`gradalign.skipped_updates(BASE)`) as `skip_updates=` and makes the
optimizer's step a no-op in those windows: no state, no hooks, no step count, as the scaler's
skip; a closure given to step() still runs (its forward and backward are the window's).
"""

from __future__ import annotations

import types
from collections.abc import Callable, Iterable
from typing import Any

import torch

from ..errors import shown
from .facts import RecorderError


def checked_updates(skip_updates: Iterable[int] | None) -> frozenset[int]:
    """The updates to skip, each a whole number >= 0 (a one-line RecorderError otherwise)."""
    if skip_updates is None:
        return frozenset()
    if isinstance(skip_updates, str | bytes) or not isinstance(skip_updates, Iterable):
        raise RecorderError(
            f"skip_updates must be update numbers (gradalign.skipped_updates(BASE)), got "
            f"{shown(skip_updates)}"
        )
    updates = list(skip_updates)
    for u in updates:
        if isinstance(u, bool) or not isinstance(u, int) or u < 0:
            raise RecorderError(f"skip_updates holds {shown(u)}: an update number is an int >= 0")
    return frozenset(updates)


def skip_steps(
    optimizer: torch.optim.Optimizer, updates: frozenset[int], current: Callable[[], int]
) -> Callable[[], None]:
    """Make `optimizer.step()` a no-op while `current()` (the open window) is in `updates`;
    returns the stop. The step is replaced on the instance by a bound method, so an LR scheduler
    created later still wraps it; after the stop it only passes calls through."""
    if not updates:
        return lambda: None
    had_own = "step" in optimizer.__dict__
    inner = optimizer.step
    active = [True]

    def step(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not (active[0] and current() in updates):
            return inner(*args, **kwargs)
        closure = kwargs.get("closure", args[0] if args else None)
        if closure is not None:
            with torch.enable_grad():
                closure()
        return None

    mine = types.MethodType(step, optimizer)
    optimizer.step = mine  # type: ignore[method-assign]

    def stop() -> None:
        active[0] = False
        if optimizer.__dict__.get("step") is mine:  # nothing wrapped it since: put it back
            if had_own:
                optimizer.step = inner  # type: ignore[method-assign]
            else:
                del optimizer.step

    return stop
