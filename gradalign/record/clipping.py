"""Seeing gradient clipping without asking the loop for it.

While a Recorder is open, `torch.nn.utils.clip_grad_norm_`, `clip_grads_with_norm_` (torch's
split API, after `get_total_norm`) and `clip_grad_value_` (as frameworks call them: through the
module attribute) report each call to every open Recorder whose model owns the clipped
parameters: a norm clip with the total norm before it (computed, or given to the split API), a
value clip with its clip value. A clip made inside another (torch's `clip_grad_norm_` may call
`clip_grads_with_norm_`) is the outer one's and is not reported again.

A loop that imported `clip_grad_norm_` by name before recording began (`from torch.nn.utils
import clip_grad_norm_`, the common import) holds torch's own function, which the patch of the
module attribute cannot reach; that function clips through `_clip_grads_with_norm_` (torch >=
2.6), looked up in its module at each call, which is patched too: its call is seen there, with
the norm it is given. torch's own `clip_grad_value_` groups the gradients it clamps with
`_group_tensors_by_device_and_dtype`, also looked up in its module at each call: patched too, a
call from `clip_grad_value_`'s own code (told by its frame) is that clip, seen with the
`clip_value` of that frame and the gradients it groups. Before torch 2.6 a `clip_grad_norm_`
imported by name is not seen; a loop can pass the norm itself with
`Recorder.grads(pre_clip_norm=...)`.
"""

from __future__ import annotations

import functools
import inspect
import math
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.utils
import torch.nn.utils.clip_grad


@dataclass(frozen=True)
class Clip:
    """One clipping call: by norm (`total`, the norm before it) or by value (`value`);
    `reads_only`: its threshold is infinite (`clip_grad_norm_(params, inf)`, which logs the
    norm), so it clips nothing; `of_grads`: the tensors told are the clipped gradients."""

    total: torch.Tensor | None = None
    value: float | None = None
    reads_only: bool = False
    max_norm: float | torch.Tensor | None = None  # a norm clip's threshold (`_threshold`)
    of_grads: bool = False  # told the gradients clipped, not their parameters (`_GROUP`)


def _infinite(limit: Any) -> bool:
    """A threshold that clips nothing; a tensor's is read only where it is on the CPU (no
    host sync)."""
    if isinstance(limit, torch.Tensor):
        return limit.device.type == "cpu" and limit.numel() == 1 and bool(limit.isinf())
    try:
        return math.isinf(float(limit))
    except (TypeError, ValueError):
        return False


def _threshold(limit: Any) -> float | torch.Tensor | None:
    """A norm clip's max_norm: a number's or a CPU scalar tensor's as a float, a scalar tensor's
    on a device as a float64 copy there (read once, when the run is written: no host sync per
    step); None where it is no number."""
    if isinstance(limit, torch.Tensor):
        if limit.numel() != 1:
            return None
        if limit.device.type == "cpu":
            return float(limit)
        return limit.detach().reshape(()).to(torch.float64, copy=True)
    try:
        return float(limit)
    except (TypeError, ValueError):
        return None


Listener = Callable[[list[torch.Tensor], Clip], None]
_listeners: list[Listener] = []
_original: dict[tuple[Any, str], Any] = {}
_NAMES = ("clip_grad_norm_", "clip_grads_with_norm_", "clip_grad_value_")
_SPLIT = "_clip_grads_with_norm_"  # torch.nn.utils.clip_grad's own, which clip_grad_norm_ calls
# A depth guard keeps a clip inside a clip (clip_grad_norm_ calling the private or the public
# split clip) from counting twice.
_PATCHED = [
    (module, name)
    for module in (torch.nn.utils, torch.nn.utils.clip_grad)
    for name in _NAMES
    if hasattr(module, name)
] + ([(torch.nn.utils.clip_grad, _SPLIT)] if hasattr(torch.nn.utils.clip_grad, _SPLIT) else [])
_GROUP = "_group_tensors_by_device_and_dtype"  # what torch's own clip_grad_value_ calls
_VALUE_CODE = getattr(
    inspect.unwrap(getattr(torch.nn.utils.clip_grad, "clip_grad_value_", None)), "__code__", None
)
if (
    _VALUE_CODE is not None
    and _VALUE_CODE.co_name == "clip_grad_value_"
    and hasattr(torch.nn.utils.clip_grad, _GROUP)
):
    _PATCHED.append((torch.nn.utils.clip_grad, _GROUP))
_inside = threading.local()


def _params(parameters: Any) -> list[torch.Tensor]:
    return [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)


def _tell(params: list[torch.Tensor], clip: Clip) -> None:
    for listener in list(_listeners):
        listener(params, clip)


def _outer(
    original: Callable[..., Any], params: list[torch.Tensor], *args: Any, **kwargs: Any
) -> tuple[Any, bool]:
    """`original(params, ...)`, and whether this call is the outermost clip (the one to tell)."""
    depth = getattr(_inside, "depth", 0)
    _inside.depth = depth + 1
    try:
        return original(params, *args, **kwargs), depth == 0
    finally:
        _inside.depth = depth


def _grouping(original: Callable[..., Any]) -> Callable[..., Any]:
    """`_group_tensors_by_device_and_dtype` telling a call from torch's own `clip_grad_value_`
    (one imported by name) as its clip; any other caller's call passes as it is."""

    @functools.wraps(original)
    def grouped(tensorlistlist: Any, *args: Any, **kwargs: Any) -> Any:
        caller = sys._getframe(1)
        if caller.f_code is _VALUE_CODE and not getattr(_inside, "depth", 0):
            value = caller.f_locals.get("clip_value")  # float(clip_value) by then
            if isinstance(value, float) and isinstance(tensorlistlist, list) and tensorlistlist:
                grads = [g for g in tensorlistlist[0] if isinstance(g, torch.Tensor)]
                _tell(grads, Clip(value=value, reads_only=math.isinf(value), of_grads=True))
        return original(tensorlistlist, *args, **kwargs)

    return grouped


def _patched(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
    if name == _GROUP:
        return _grouping(original)
    if name == "clip_grad_norm_":

        @functools.wraps(original)
        def clip_grad_norm_(parameters: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
            params = _params(parameters)
            total, outer = _outer(original, params, *args, **kwargs)
            if outer:
                limit = args[0] if args else kwargs.get("max_norm")
                clip = Clip(total=total, reads_only=_infinite(limit), max_norm=_threshold(limit))
                _tell(params, clip)
            return total

        return clip_grad_norm_

    if name in ("clip_grads_with_norm_", _SPLIT):

        @functools.wraps(original)
        def clip_grads_with_norm_(
            parameters: Any, max_norm: float, total_norm: torch.Tensor, *args: Any, **kwargs: Any
        ) -> None:
            params = _params(parameters)
            result, outer = _outer(original, params, max_norm, total_norm, *args, **kwargs)
            if outer:  # the norm it was given is the norm before it: kept on device, no sync
                total = torch.as_tensor(total_norm)
                clip = Clip(total, reads_only=_infinite(max_norm), max_norm=_threshold(max_norm))
                _tell(params, clip)
            return result

        return clip_grads_with_norm_

    @functools.wraps(original)
    def clip_grad_value_(parameters: Any, clip_value: float, *args: Any, **kwargs: Any) -> Any:
        params = _params(parameters)
        result, outer = _outer(original, params, clip_value, *args, **kwargs)
        if outer:
            value = float(clip_value)
            _tell(params, Clip(value=value, reads_only=math.isinf(value)))
        return result

    return clip_grad_value_


def listen(listener: Listener) -> Callable[[], None]:
    """Call `listener(parameters, clip)` on every clip; returns the function that stops."""
    if not _listeners:
        for module, name in _PATCHED:
            _original[module, name] = getattr(module, name)
            setattr(module, name, _patched(name, _original[module, name]))
    _listeners.append(listener)

    def stop() -> None:
        if listener in _listeners:
            _listeners.remove(listener)
        if not _listeners and _original:
            for module, name in _PATCHED:
                setattr(module, name, _original.pop((module, name)))

    return stop
