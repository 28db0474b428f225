"""`python -m gradalign` and the `gradalign` command. Importing the command line takes a moment
(numpy, typer, rich): a Ctrl-C then is exit 130 as everywhere else, never a traceback.

Once the command has settled its exit code (its outputs written or refused), the process ends
at once: the exit functions run (atexit: a Recorder never closed drops its staged run), the
streams are flushed, and the interpreter's teardown, which takes 0.5 to 1.5 s once torch is
imported and writes nothing of ours, is skipped. A Ctrl-C no longer changes the settled code: in
that teardown Python restores the default SIGINT action, under which a Ctrl-C in the last
moments killed the process without a word."""

import atexit
import contextlib
import os
import signal
import sys
import threading

from .allocator import keep_freed_memory
from .errors import INTERRUPTED_EARLY, INTERRUPTED_LATE, Terminated, wrapped_interrupt


def run() -> None:
    """Import the command line and run it; interrupted while importing: exit 130 (143 for
    SIGTERM, which killed the process without a word there), one line."""
    keep_freed_memory()  # the command's own process: judging churns ~1 MiB arrays
    default = signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    if default:  # kept through the command, whose guard (errors.sigterm_as_interrupt) then
        # finds one: put back before main(), it left ~35 ms in which SIGTERM ended it unsaid
        signal.signal(signal.SIGTERM, _terminated)
    try:
        from .cli import main
    except (KeyboardInterrupt, Terminated) as exc:
        _interrupted(INTERRUPTED_EARLY, exc)
    except Exception as exc:  # an interrupt an import wrapped (a class's __set_name__)
        inner = wrapped_interrupt(exc)
        if inner is None:
            raise
        _interrupted(INTERRUPTED_EARLY, inner)
    try:
        main()
    except SystemExit as exc:
        _settled(default)
        _end(exc.code)
        raise
    except (KeyboardInterrupt, Terminated) as exc:  # outside the command's own guard
        _settled(default)
        _interrupted(INTERRUPTED_LATE, exc, end=True)
    _settled(default)


def _settled(default: bool) -> None:
    """The exit code is settled: SIGTERM ends the process as it would have (no handler left)."""
    if default:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _interrupted(message: str, exc: BaseException, end: bool = False) -> None:
    """Exit 130 for a Ctrl-C, 143 for SIGTERM, saying `message` in one line."""
    print(message, file=sys.stderr)
    code = 143 if isinstance(exc, Terminated) else 130
    if end:
        _end(code)
    sys.exit(code)


def _terminated(signum: int, frame: object) -> None:
    """SIGTERM: Terminated, once (`timeout` sends it to the process and then to its group, and
    the second came inside the first's handling: a traceback and exit 1)."""
    if not _TERMINATED:
        _TERMINATED.append(signum)
        raise Terminated


_TERMINATED: list[int] = []


def _end(code: object) -> None:
    """End the process with `code` now, where nothing else is left to do: no other thread that
    the exit would wait for (a Ctrl-C must still cut such a wait short), and streams that flush.
    Otherwise return, and Python exits the usual way."""
    if code is None:
        code = 0
    if not isinstance(code, int) or isinstance(code, bool):
        return
    if any(t.is_alive() and not t.daemon for t in threading.enumerate() if t is not _MAIN):
        return
    with contextlib.suppress(ValueError, OSError):  # not the main thread: nothing to settle
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:  # None: started with the descriptor closed
                stream.flush()
    except (OSError, ValueError):  # a closed or broken stream: Python's own exit reports it
        return
    atexit._run_exitfuncs()
    os._exit(code)


_MAIN = threading.main_thread()

if __name__ == "__main__":
    run()
