"""Errors that the CLI turns into a one-line message and exit code 2, and how values are shown in
such messages."""

from __future__ import annotations

import contextlib
import errno
import signal
import threading
from collections.abc import Iterator
from typing import Any

INTERRUPTED_EARLY = "interrupted: nothing was written"  # a Ctrl-C before any command ran
INTERRUPTED_LATE = "interrupted: nothing half-written was left in place"  # a command's Ctrl-C


class BadInput(Exception):
    """Input the tool cannot work with: a missing or corrupt run, bad options, incompatible runs."""


class ReportRefused(BadInput):
    """A report path refused (on an input, a folder, a file that is no report; one that cannot be
    written): the command then writes no report there or at its other paths, not even its error
    (`report.error_reports`)."""


def cut(text: str, limit: int) -> str:
    """`text`, or its first `limit` − 3 characters and "...": never longer than `limit`."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def shown(value: Any, limit: int = 60) -> str:
    """A value for an error message, never longer than `limit` characters (a hostile input must
    not make the message itself huge)."""
    text = repr(value) if not isinstance(value, dict | list | tuple) else type(value).__name__
    return cut(text, limit)


def stated_version(version: Any) -> str:
    """How a file states its format version, for a refusal: it names none, or which."""
    return (
        "names no format_version" if version is None else f"gives format_version {shown(version)}"
    )


class Terminated(BaseException):
    """SIGTERM (a CI job cancelled, `timeout`, `docker stop`): cleaned up as Ctrl-C is, by every
    `except BaseException` that removes what it staged; not a KeyboardInterrupt, which typer
    turns into exit 130."""


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """While a command runs, SIGTERM goes through the Ctrl-C cleanup (in the main thread, unless
    a handler of its own is installed); the handler before is put back after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield
        return

    def terminated(signum: int, frame: Any) -> None:
        raise Terminated

    previous = signal.signal(signal.SIGTERM, terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """Ctrl-C and SIGTERM held until the block ends, then sent again to the handlers in force
    before (KeyboardInterrupt, Terminated, or the default action): an interrupt raised inside
    torch's import, in its C++ extension's init, is no Python exception but std::terminate,
    exit 134 with a C++ message (about 1 in 40 interrupts sent while `gradalign baseline`
    imported torch). In the main thread only."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []
    previous = {
        sig: signal.signal(sig, lambda signum, frame: held.append(signum))
        for sig in (signal.SIGINT, signal.SIGTERM)
    }
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if held:  # sent again, to the handler in force before: Terminated, a Ctrl-C, the default
        signal.raise_signal(held[0])


DISK_ERRORS = {  # what a full, read-only or failing disk raises: bad input, not a bug
    *(errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOTDIR),
    *(errno.EIO, errno.EFBIG),  # a write that failed in the background writer too
    *(errno.ENAMETOOLONG, errno.ELOOP),  # a path the file system cannot hold or resolve
}


def debug_wanted(environ: Any) -> bool:
    """GRADALIGN_DEBUG set to anything but '', 0, false, no or off: GRADALIGN_DEBUG=0 turned
    debugging on (any non-empty string did)."""
    value = str(environ.get("GRADALIGN_DEBUG", "")).strip().lower()
    return value not in ("", "0", "false", "no", "off")


def wrapped_interrupt(exc: BaseException) -> BaseException | None:
    """The KeyboardInterrupt or `Terminated` another exception wraps (Python 3.11 wraps one
    raised in a class's `__set_name__`, as an import may run, in a RuntimeError), else None."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, (KeyboardInterrupt, Terminated)):
            return cause
        cause = cause.__cause__ or cause.__context__
    return None
