"""What a Recorder attaches to the training loop, and what becomes of it when the Recorder is
dropped without `close()` or `abort()`.

The optimizer, the model and torch's clip functions hold the Recorder's hooks. Hooks bound to
the Recorder would keep it alive as long as the optimizer (and, through the clip listener, the
process), still writing every step into a run nobody will close. They hold it weakly instead
(`weakly`), and a dropped Recorder is discarded as `abort()` would: its hooks removed, its
staged run and lock deleted, a `ResourceWarning` said (as Python says of an unclosed file)."""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Callable
from typing import Any, Protocol


class _Removable(Protocol):
    def remove(self) -> None: ...


class _Aborts(Protocol):
    def abort(self) -> None: ...


def weakly(method: Callable[..., Any]) -> Callable[..., Any]:
    """`method` (bound to a Recorder) called through a weak reference: once its Recorder is
    gone the call does nothing and returns None, as a hook that changes nothing returns."""
    ref = weakref.WeakMethod(method)

    def call(*args: Any, **kwargs: Any) -> Any:
        bound = ref()
        return None if bound is None else bound(*args, **kwargs)

    return call


class Attached:
    """The hook handles and stop functions of one Recorder; `detach()` runs each once."""

    def __init__(self) -> None:
        self.handles: list[_Removable] = []
        self.stops: list[Callable[[], None]] = []

    def detach(self) -> None:
        handles, stops = self.handles, self.stops
        self.handles, self.stops = [], []
        for handle in handles:
            handle.remove()
        for stop in stops:
            stop()


def discard_when_dropped(owner: object, attached: Attached, writer: _Aborts, where: str) -> Any:
    """Discard `owner`'s run if it is collected unclosed; returns the finalizer, which
    `close()` and `abort()` detach."""
    finalizer = weakref.finalize(owner, _discard, attached, writer, where)
    finalizer.atexit = False  # at exit the background writer drops unfinished runs itself
    return finalizer


def _discard(attached: Attached, writer: _Aborts, where: str) -> None:
    attached.detach()
    writer.abort()
    warnings.warn(
        f"a Recorder of {where} was dropped without close(): its run was discarded",
        ResourceWarning,
        stacklevel=1,  # raised by the collector: no caller's line to point at
    )
