"""The consoles the command line prints through, robust to where its output goes: a terminal, a
CI log, a pipe whose reader went away (`| head -1`), a closed stream. What a reader no longer
reads is dropped; the command goes on, writes its reports, and its exit code stays the verdict."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterable

from rich.console import Console

from ..errors import INTERRUPTED_EARLY
from ..paths import descriptor


def width() -> int | None:
    """A terminal's own width; off one (CI logs), COLUMNS if set, else wide enough for the table.
    A closed stdout (Python's `sys.stdout` is None) is not a terminal."""
    stdout = sys.stdout
    if stdout is not None and stdout.isatty():
        return None
    columns = os.environ.get("COLUMNS", "")
    return int(columns) if columns.isdigit() and 40 <= int(columns) <= 10_000 else 160


class SafeConsole(Console):
    """A rich console that outlives its reader: rich's own answer to a broken pipe is exit 1,
    which to a CI gate reads "not aligned" (and skipped every report still to be written)."""

    def on_broken_pipe(self) -> None:
        """Drop this console's further output and point its stream at /dev/null, so that the
        interpreter's last flush of the stream fails neither."""
        self.quiet = True
        try:
            fileno = self.file.fileno()
        except (AttributeError, OSError, ValueError):
            return
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, fileno)
        finally:
            os.close(devnull)


def safe_help() -> None:
    """typer prints help (`--help`, a bare group) through rich consoles of its own, which answered
    `gradalign --help | head -1` with exit 1: they are made SafeConsoles too."""
    with contextlib.suppress(ImportError, AttributeError):
        from typer import rich_utils

        if rich_utils.Console is Console:
            rich_utils.Console = SafeConsole  # type: ignore[misc]


def console(stderr: bool = False) -> Console:
    """The console for stdout (the tables) or stderr (messages, progress, errors)."""
    return SafeConsole(stderr=stderr, highlight=False, width=width())


def table_console(reports: Iterable[os.PathLike[str] | str], out: Console, err: Console) -> Console:
    """Where a command's table goes: stdout, unless a report is written there (`--json
    /dev/stdout | jq`), which then carries that report alone; the table goes to stderr."""
    return err if any(descriptor(path) == 1 for path in reports) else out


def printable_streams() -> None:
    """stdout and stderr write what cannot be encoded as escapes: a file name that is not UTF-8
    (lone surrogates, PEP 383) in a table or a message crashed the print under a UTF-8 locale
    or PYTHONIOENCODING=utf-8, whose stdout is strict."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None and getattr(stream, "errors", None) == "strict":
            with contextlib.suppress(OSError, ValueError):
                reconfigure(errors="backslashreplace")


def ready_streams(console: Console, interrupted: int) -> None:
    """`printable_streams` and `safe_help`, which imports typer's help printer (rich.markdown):
    a Ctrl-C there is one line on `console` and exit `interrupted`, never a traceback."""
    try:
        printable_streams()
        safe_help()
    except KeyboardInterrupt:
        last_word(console, INTERRUPTED_EARLY)
        sys.exit(interrupted)


def last_word(console: Console, text: str) -> None:
    """The line a command ends with (an error, "interrupted"), as far as its stream takes it: a
    stderr that is full or gone must not turn the exit code into Python's 1 ("not aligned")."""
    with contextlib.suppress(OSError):
        console.print(text, markup=False, emoji=False, soft_wrap=True)
