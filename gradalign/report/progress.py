"""Feedback on a terminal: messages on stderr and a progress bar (no bar, no stray lines, in
CI logs, where a line per finished stage is enough)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn


class RichFeedback:
    """`api.Feedback` drawn with rich on `console`."""

    def __init__(self, console: Console) -> None:
        self.console = console

    def message(self, text: str) -> None:
        self.console.print(text, markup=False, soft_wrap=True)

    @contextmanager
    def progress(self, label: str, total: int) -> Iterator[Callable[[], None]]:
        with Progress(
            TextColumn(label),
            BarColumn(),
            MofNCompleteColumn(),
            console=self.console,
            transient=True,
            disable=not self.console.is_terminal,
        ) as bar:
            task = bar.add_task(label, total=total)
            yield lambda: bar.advance(task)
