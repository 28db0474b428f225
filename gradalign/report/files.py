"""The report files one command writes (`--json`, `--junit`, `--markdown`, `--plot`, `--html`) and
what a CI job gets without asking: the GitHub step summary and `::error` lines. Their paths are
known before any work, so they are checked first (`runs.outputs.check_outputs`)."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path

from ..judge.results import Comparison


@dataclass(frozen=True)
class ReportFiles:
    """Where each requested report goes (None: not requested); `plot` is a directory."""

    json: Path | None = None
    junit: Path | None = None
    markdown: Path | None = None
    plot: Path | None = None
    html: Path | None = None

    def paths(self) -> list[Path]:
        """Every file that will be written, for the checks before any work."""
        from .plots import plot_paths

        files = [getattr(self, f.name) for f in fields(self) if f.name != "plot"]
        found = [Path(p) for p in files if p is not None]
        return found + (plot_paths(Path(self.plot)) if self.plot is not None else [])

    def check(self, read: Sequence[Path] = ()) -> None:
        """What can be refused before any work: a report on or inside a file the command reads
        (`read`: a config, a golden file; the runs are checked where they are opened), a step
        summary that cannot be appended to, plots without matplotlib."""
        from .github import check_step_summary

        if read:
            from ..runs.outputs import check_outputs

            check_outputs([], read, self.paths())
        check_step_summary(os.environ)
        if self.plot is not None:
            from .plots import require_matplotlib

            require_matplotlib()


def _writers() -> dict[str, Callable[[Comparison, Path], object]]:
    from .html import write_html
    from .json_report import write_json
    from .junit import write_junit
    from .markdown import write_markdown
    from .plots import write_plots

    return {
        "json": write_json,
        "junit": write_junit,
        "markdown": write_markdown,
        "plot": write_plots,
        "html": write_html,
    }


def write_reports(
    comparison: Comparison, files: ReportFiles, environ: Mapping[str, str] | None = None
) -> list[str]:
    """Write every requested report, append the GitHub step summary when the job has one, and
    return the `::error` lines a GitHub Actions job should print (none elsewhere). An interrupt
    meanwhile is held until the set is written: an interrupted job never leaves part of it."""
    from ..runs.writer import deferred_interrupts
    from .github import annotations, append_step_summary, in_actions, is_step_summary
    from .output import one_set

    environ = os.environ if environ is None else environ
    with deferred_interrupts():  # Ctrl-C or SIGTERM lands after the set: all written, or none
        with one_set():  # a failure (a full disk) before the last: none replaced
            for name, write in _writers().items():
                target = getattr(files, name)
                if target is None or (name == "markdown" and is_step_summary(target, environ)):
                    continue  # the step summary is appended to below, once
                write(comparison, Path(target))
        append_step_summary(comparison, environ)
    return annotations(comparison) if in_actions(environ) else []
