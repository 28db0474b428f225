"""Seeing the gradient norm before clipping without asking the loop for it.

While a Recorder is open, `torch.nn.utils.clip_grad_norm_` (as frameworks call it: through the
module attribute) reports the total norm it computed to every open Recorder whose model owns the
clipped parameters. A loop that imported the function by name before recording began is not
seen; it can pass the norm itself with `Recorder.grads(pre_clip_norm=...)`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.utils
import torch.nn.utils.clip_grad

Listener = Callable[[list[torch.Tensor], torch.Tensor], None]
_listeners: list[Listener] = []
_original: dict[str, Any] = {}


def _patched(original: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    @functools.wraps(original)
    def clip_grad_norm_(parameters: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
        params = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
        total = original(params, *args, **kwargs)
        for listener in list(_listeners):
            listener(params, total)
        return total

    return clip_grad_norm_


def listen(listener: Listener) -> Callable[[], None]:
    """Call `listener(parameters, total_norm)` on every clip; returns the function that stops."""
    if not _listeners:
        _original["utils"] = torch.nn.utils.clip_grad_norm_
        _original["module"] = torch.nn.utils.clip_grad.clip_grad_norm_
        torch.nn.utils.clip_grad_norm_ = _patched(_original["utils"])
        torch.nn.utils.clip_grad.clip_grad_norm_ = _patched(_original["module"])
    _listeners.append(listener)

    def stop() -> None:
        if listener in _listeners:
            _listeners.remove(listener)
        if not _listeners and _original:
            torch.nn.utils.clip_grad_norm_ = _original.pop("utils")
            torch.nn.utils.clip_grad.clip_grad_norm_ = _original.pop("module")

    return stop
