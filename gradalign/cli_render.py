"""What every `gradalign` command shares: its consoles, its progress feedback, the report files
it was asked for, and the rendering of a comparison into the exit code."""

from __future__ import annotations

import os
from pathlib import Path

from .errors import debug_wanted
from .report.terminal import console, table_console

out_console = console()
err_console = console(stderr=True)
debug = {"on": debug_wanted(os.environ)}


def feedback():
    from .report.progress import RichFeedback

    return RichFeedback(err_console)


def report_files(reports: dict | None, *read: Path | None):
    """The report files asked for, checked before any work (`report.files.requested`)."""
    from .report.files import requested

    return requested(reports, read)


def verdict(comparison, files) -> int:
    """Render a comparison, write its reports, and turn its verdict into the exit code."""
    from .judge.results import FAIL
    from .report.files import write_reports
    from .report.table import render

    render(comparison, table_console(files.paths(), out_console, err_console))
    for line in write_reports(comparison, files):
        err_console.print(line, markup=False, emoji=False, soft_wrap=True)
    return 1 if comparison.verdict == FAIL else 0
