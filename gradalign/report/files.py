"""The report files one command writes (`--json`, `--junit`, `--markdown`, `--plot`, `--html`) and
what a CI job gets without asking: the GitHub step summary and `::error` lines. Their paths are
known before any work, so they are checked first (`runs.outputs.check_outputs`)."""

from __future__ import annotations

import json
import os
import re
import stat
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
        return [path for _, path in self.named_paths()]

    def named_paths(self) -> list[tuple[str, Path]]:
        """Each file that will be written, with the report it holds (`plot` for each plot)."""
        from .plots import plot_paths

        named = [(f.name, getattr(self, f.name)) for f in fields(self) if f.name != "plot"]
        found = [(name, Path(p)) for name, p in named if p is not None]
        plots = plot_paths(Path(self.plot)) if self.plot is not None else []
        return found + [("plot", path) for path in plots]

    def check(self, read: Sequence[Path] = ()) -> None:
        """What can be refused before any work: a report on or inside a file the command reads
        (`read`: a config, a golden file; the runs are checked where they are opened), a step
        summary that cannot be appended to, plots without matplotlib."""
        from ..runs.outputs import check_outputs
        from .github import check_step_summary, is_step_summary

        check_outputs([], read, self.paths())  # and the paths among themselves
        check_replaceable(self.paths(), appended=self.markdown)
        beside = [  # the Markdown report given as the summary is appended there once
            p for p in self.paths() if p != self.markdown or not is_step_summary(p, os.environ)
        ]
        check_step_summary(os.environ, beside)
        if self.plot is not None:
            from .plots import require_matplotlib

            require_matplotlib()


def check_replaceable(paths: Sequence[Path], appended: Path | None = None) -> None:
    """A report replaces an earlier report of this tool (or an empty file), nothing else: a
    file with content that is no gradalign report is refused (ReportRefused), through links too.
    Streams are written into; `appended` (the Markdown report) may be the job's step summary,
    which it is appended to."""
    from ..errors import ReportRefused
    from ..paths import is_stream
    from .github import is_step_summary

    for path in paths:
        if is_stream(path) or (path == appended and is_step_summary(path, os.environ)):
            continue
        if not replaceable(Path(os.path.realpath(path))):  # a link is written through
            raise ReportRefused(
                f"report {path}: exists and is not a gradalign report; refusing to overwrite "
                "it (move it, or choose another path)"
            )


_ASKED: list[ReportFiles] = []  # this process's report sets (`requested`)
_CLEARED: list[ReportFiles] = []  # those that passed the checks before any work
_WRITTEN: list[Path] = []  # the report files this command wrote whole
_KEPT: list[Path] = []  # the golden files it wrote whole


def requested(reports: dict | None, read: Sequence[Path | None] = ()) -> ReportFiles:
    """The report files asked for, refused before any work where they would land on a file the
    command reads (`read`: a config, a golden file) or on a file that is no report, or plots
    need matplotlib; remembered, so that a command that ends in error (this refusal too)
    leaves the error there, not an earlier run's verdict (`after_error`)."""
    files = ReportFiles(**(reports or {}))
    _ASKED.append(files)  # a refusal of one path removes the earlier reports at the others
    files.check([path for path in read if path is not None])
    _CLEARED.append(files)
    return files


def forget_asked() -> None:
    """A new command starts: no report set is its yet."""
    _ASKED.clear()
    _CLEARED.clear()
    _WRITTEN.clear()
    _KEPT.clear()


def kept_whole(golden: Path) -> None:
    """A golden file this command has just put in place whole (an interrupt after it says so)."""
    _KEPT.append(golden)


def written_whole() -> str:
    """What this command wrote whole, for an interrupt after it ("its 4 report file(s) were
    written whole"): its reports and golden files ('' for none: nothing it wrote is in place)."""
    said = [f"its {len(_WRITTEN)} report file(s)"] if _WRITTEN else []
    said += [f"the golden file {path}" for path in _KEPT]
    one = len(said) == 1 and not _WRITTEN
    return f"{' and '.join(said)} {'was' if one else 'were'} written whole" if said else ""


def after_error(message: str, code: int, refused: bool = False) -> tuple[str, list[str]]:
    """A command ends in error: its asked JSON, JUnit and Markdown reports say the error where
    their set passed the checks before any work and the error refused no report path
    (`refused`), and this tool's earlier reports at its other
    paths are removed, so that none describes an
    earlier run (a CI job reading its JUnit file showed a pass; `error_reports`). Returns what to
    add to the error line (the reports removed, '' for none) and the lines to print after it
    (a GitHub Actions job's `::error` line)."""
    from .error_reports import leave_error

    cleared = [] if refused else list(_CLEARED)
    removed, lines = leave_error(list(_ASKED), cleared, message, code)
    forget_asked()
    if not removed:
        return "", lines
    if len(removed) == 1:
        return f" (removed the earlier report {removed[0]}: it described another run)", lines
    many = f" (removed the earlier reports {removed[0]} and {len(removed) - 1} more: they "
    return many + "described other runs)", lines


_SIGNS = (  # how each report begins: JUnit, Markdown, HTML, a plot
    re.compile(rb'^<\?xml[^\n]*\n<testsuites name="gradalign"'),
    re.compile("^### (?:\u2705|\u274c|\u26a0\ufe0f) gradalign: [A-Z ]{4,11}\n\n".encode()),
    re.compile(rb"^<!DOCTYPE html>.{0,400}<title>gradalign: (PASS|FAIL)</title>", re.S),
    re.compile(rb"^\x89PNG\r\n\x1a\n.{0,64}tEXtSoftware\x00gradalign", re.S),  # `plots.png`
)


def replaceable(real: Path) -> bool:
    """Whether a report may replace what stands at `real` (a path with its links resolved):
    nothing, an empty file, or a report of this tool."""
    return not _occupied(real) or is_ours(real)


def _occupied(path: Path) -> bool:
    """Whether a file with content stands at `path` (a directory there is refused where the
    report is written)."""
    try:
        info = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISREG(info.st_mode) and info.st_size > 0


def remove_ours(path: Path) -> bool:
    """Remove the report of this tool at `path` (through a link, the file it names); whether
    one was removed. Anything else there stays, a stream too."""
    from ..paths import is_stream

    real = Path(os.path.realpath(path))
    if is_stream(path) or not is_ours(real):
        return False
    try:
        real.unlink()
    except OSError:
        return False
    return True


def is_ours(path: Path) -> bool:
    """Whether `path` is a regular file this tool wrote as a report, by its own marks (a JSON
    report's verdict and checks; the others' first lines): a path that names a file of another
    kind (a run's manifest, refused when the runs are opened) is never removed."""
    try:
        if path.is_symlink() or not path.is_file():
            return False
        with path.open("rb") as handle:  # a JSON report whole, another's first lines
            head = handle.read(4096)
            if head.startswith(b"{"):
                head += handle.read()
    except OSError:
        return False
    if head.startswith(b"{"):
        try:
            data = json.loads(head)
        except ValueError:
            return False
        if not isinstance(data, dict):
            return False
        ours = {"gradalign", "verdict", "checks", "diagnosis"} <= set(data)
        return ours or _selftest_json(data)
    return any(sign.match(head) for sign in _SIGNS)


def _selftest_json(data: dict) -> bool:
    """`gradalign selftest --json`'s report: `ok` and its cases, each a setup and a fault."""
    cases = data.get("cases")
    return (
        set(data) == {"ok", "cases"}
        and isinstance(cases, list)
        and all(isinstance(c, dict) and {"setup", "fault"} <= set(c) for c in cases)
    )


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
    return the lines to print on stderr: a warning where the summary could not be appended, and
    the `::error` lines of a GitHub Actions job (none elsewhere). An interrupt
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
        _WRITTEN.extend(files.paths())  # an interrupt held till here says they are whole
        unwritten = append_step_summary(comparison, environ)
    lines = annotations(comparison) if in_actions(environ) else []
    return [unwritten, *lines] if unwritten else lines
