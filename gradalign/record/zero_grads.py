"""Seeing zero_grad() calls without changing the objects the loop holds.

While a Recorder is open, `torch.optim.Optimizer.zero_grad` and `torch.nn.Module.zero_grad` (as
every loop and framework calls them: methods of the classes) report each call on an optimizer or
model a Recorder watches. The classes are patched, not the instances: an instance keeps no
attribute of ours, so it pickles and deep-copies as before (a copy is not watched). An optimizer
or model whose class overrides zero_grad without calling the base method is not seen; the judge
then reads no counts.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

Listener = Callable[[], None]
_listeners: dict[int, list[Listener]] = {}  # id(owner) -> callbacks
_original: dict[type, Any] = {}
_CLASSES = (torch.optim.Optimizer, torch.nn.Module)


def _patched(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def zero_grad(self: Any, *args: Any, **kwargs: Any) -> Any:
        for listener in list(_listeners.get(id(self), ())):
            listener()
        return original(self, *args, **kwargs)

    return zero_grad


def listen(listener: Listener, *owners: Any) -> Callable[[], None]:
    """Call `listener()` on every zero_grad() of `owners`; returns the function that stops."""
    if not _original:
        for cls in _CLASSES:
            _original[cls] = cls.zero_grad
            cls.zero_grad = _patched(_original[cls])  # type: ignore[method-assign]
    keys = [id(owner) for owner in owners]
    for key in keys:
        _listeners.setdefault(key, []).append(listener)

    def stop() -> None:
        for key in keys:
            found = _listeners.get(key, [])
            if listener in found:
                found.remove(listener)
            if not found:
                _listeners.pop(key, None)
        if not _listeners and _original:
            for cls, method in _original.items():
                cls.zero_grad = method  # type: ignore[method-assign]
            _original.clear()

    return stop
