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
from .errors import INTERRUPTED_EARLY, INTERRUPTED_LATE, Terminated


def run() -> None:
    """Import the command line and run it; interrupted while importing: exit 130 (143 for
    SIGTERM, which killed the process without a word there), one line."""
    keep_freed_memory()  # the command's own process: judging churns ~1 MiB arrays
    default = signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    if default:  # until the command installs its own (errors.sigterm_as_interrupt)
        signal.signal(signal.SIGTERM, _terminated)
    try:
        from .cli import main
    except (KeyboardInterrupt, Terminated) as exc:
        print(INTERRUPTED_EARLY, file=sys.stderr)
        sys.exit(143 if isinstance(exc, Terminated) else 130)
    finally:
        if default:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        main()
    except SystemExit as exc:
        _end(exc.code)
        raise
    except KeyboardInterrupt:  # past the command's own guard, on its way out
        print(INTERRUPTED_LATE, file=sys.stderr)
        _end(130)
        sys.exit(130)


def _terminated(signum: int, frame: object) -> None:
    raise Terminated


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
