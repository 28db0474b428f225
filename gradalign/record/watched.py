"""Seeing calls of a method on chosen objects without changing those objects.

`watch(cls, name, owner, callback)` patches the method `name` of class `cls` (and so of its
subclasses) to call `callback()` before it runs, whenever it runs on `owner`. The class is
patched, not the instance: an instance keeps no attribute of ours, so it pickles and deep-copies
as before (a copy is not watched). The class gets its own method back once nothing watches it.
A subclass that overrides the method without calling it is not seen. A wrapper that shares a
watched optimizer's state and names it `_optimizer` (Lightning's `LightningOptimizer`, what
`self.optimizers()` returns: a subclass of the optimizer's class whose methods run on the
wrapper) counts as that optimizer.

`before_step(optimizer, callback)` calls `callback()` as a torch optimizer starts a step, before
its own step pre-hooks (a Recorder's among them), however its `step` is reached: torch's lr
schedulers replace an optimizer's `step` on the instance, which a patched class never sees.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

Callback = Callable[[], None]
_MISSING = object()
_callbacks: dict[tuple[type, str], dict[int, list[Callback]]] = {}  # per method, per owner
_own: dict[tuple[type, str], Any] = {}  # what the class itself held under the name


def _patched(key: tuple[type, str], original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        owners = _callbacks.get(key, {})
        found = owners.get(id(self))
        if found is None and owners:  # a wrapper that shares the watched object's state
            found = owners.get(id(getattr(self, "_optimizer", None)))
        for callback in list(found or ()):
            callback()
        return original(self, *args, **kwargs)

    return method


def watch(cls: type, name: str, owner: Any, callback: Callback) -> Callable[[], None]:
    """Call `callback()` whenever `owner.<name>(...)` runs (through `cls`); returns the stop."""
    key = (cls, name)
    if key not in _own:
        _own[key] = cls.__dict__.get(name, _MISSING)
        setattr(cls, name, _patched(key, getattr(cls, name)))
    _callbacks.setdefault(key, {}).setdefault(id(owner), []).append(callback)

    def stop() -> None:
        owners = _callbacks.get(key, {})
        found = owners.get(id(owner), [])
        if callback in found:
            found.remove(callback)
        if not found:
            owners.pop(id(owner), None)
        if not owners and key in _own:
            _callbacks.pop(key, None)
            own = _own.pop(key)
            if own is _MISSING:
                delattr(cls, name)
            else:
                setattr(cls, name, own)

    return stop


def before_step(optimizer: torch.optim.Optimizer, callback: Callback) -> Callable[[], None]:
    """Call `callback()` when `optimizer` steps, before its own pre-hooks; returns the stop."""

    def hook(stepping: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if stepping is optimizer:
            callback()

    return register_optimizer_step_pre_hook(hook).remove
