"""How long work tells people what it is doing: messages and progress. The CLI draws it on a
terminal (`report.progress.RichFeedback`); library calls stay silent unless given one."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Protocol


class Feedback(Protocol):
    """Where a long command tells people what it is doing."""

    def message(self, text: str) -> None: ...

    def progress(self, label: str, total: int) -> Any:
        """A context manager giving a callable to call once per finished step."""


class Silent:
    """Feedback that says nothing."""

    def message(self, text: str) -> None:
        pass

    @contextmanager
    def progress(self, label: str, total: int) -> Iterator[Callable[[], None]]:
        yield lambda: None
