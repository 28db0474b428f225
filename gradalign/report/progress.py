"""Feedback on a terminal: messages on stderr and a progress bar (no bar, no stray lines, in
CI logs, where a line per finished stage is enough)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

PLAIN_FIRST, PLAIN_EVERY = 5.0, 10.0


def redraws(console: Console) -> bool:
    """Whether a bar may redraw itself in place: only on a real terminal. FORCE_COLOR (common in
    CI) makes rich treat a pipe as a terminal, which asks for colours, not for redraws in a log."""
    isatty = getattr(console.file, "isatty", None)
    try:
        real = bool(isatty and isatty())
    except (OSError, ValueError):
        real = False
    return real and console.is_terminal and not console.is_dumb_terminal


class RichFeedback:
    """`api.Feedback` drawn with rich on `console`."""

    def __init__(self, console: Console) -> None:
        self.console = console

    def message(self, text: str) -> None:
        self.console.print(text, markup=False, soft_wrap=True)

    @contextmanager
    def progress(self, label: str, total: int) -> Iterator[Callable[[], None]]:
        if not redraws(self.console):
            yield self._plain(label, total)
            return
        with Progress(
            TextColumn(label),
            BarColumn(),
            MofNCompleteColumn(),
            console=self.console,
            transient=True,
        ) as bar:
            task = bar.add_task(label, total=total)
            yield lambda: bar.advance(task)

    def _plain(self, label: str, total: int) -> Callable[[], None]:
        """Off a terminal (CI logs): a plain line after the first few seconds and then every
        PLAIN_EVERY seconds, so long work shows it is alive and quick work prints nothing."""
        start, done, said = time.monotonic(), [0], [-math.inf]  # never: the first line is due

        def advance() -> None:
            done[0] += 1
            elapsed = time.monotonic() - start
            if elapsed >= PLAIN_FIRST and elapsed - said[0] >= PLAIN_EVERY:
                said[0] = elapsed
                self.console.print(f"{label}: {done[0]}/{total} ({elapsed:.0f} s)", markup=False)

        return advance
