"""GitHub Actions: the Markdown summary appended to the job's step summary (`$GITHUB_STEP_SUMMARY`)
and, on failure, a few `::error` workflow commands naming the first failing update and its cause.
Both only add to what the job shows; the exit code stays the gate."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from ..errors import ReportRefused
from ..judge.results import FAIL, Comparison
from .markdown import to_markdown
from .summary import causes, failures

MAX_ANNOTATIONS = 3


def _data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _property(text: str) -> str:
    return _data(text).replace(":", "%3A").replace(",", "%2C")


def annotations(c: Comparison) -> list[str]:
    """At most MAX_ANNOTATIONS `::error` lines for a failing comparison, none for a pass: the first
    failing update and its cause, then the other named causes."""
    if c.verdict != FAIL:
        return []
    found = failures(c)
    first = found[0].text() if found else "a check failed"
    named = causes(c)
    lines = []
    lead = named[0] if named else None
    message = f"{first}; cause {lead.code}: {lead.message}" if lead else first
    if lead is not None and lead.fix:
        message += f"; fix: {lead.fix}"
    lines.append(f"::error title={_property('gradalign: not aligned')}::{_data(message)}")
    for d in named[1:MAX_ANNOTATIONS]:
        text = d.message + (f"; fix: {d.fix}" if d.fix else "")
        lines.append(f"::error title={_property(f'gradalign: {d.code}')}::{_data(text)}")
    return lines[:MAX_ANNOTATIONS]


def in_actions(environ: Mapping[str, str]) -> bool:
    return environ.get("GITHUB_ACTIONS") == "true"


def check_step_summary(environ: Mapping[str, str], reports: Sequence[Path] = ()) -> None:
    """Before any work: `$GITHUB_STEP_SUMMARY`, when set, is a file that can be appended to and
    lies in no run. Found only after judging, a directory or a missing folder turned the verdict
    into exit 2, and a summary inside a run was appended to its files. A stream there takes no
    report of `reports` (`--json /dev/stdout` beside a summary into standard output: the
    JSON report, then the summary, parsed as neither); a Markdown report given as the summary
    itself is appended there once, and is not among them."""
    from ..paths import is_stream, resolved
    from ..runs.layout import is_run_dir
    from ..runs.outputs import one_report_per_stream

    target = environ.get("GITHUB_STEP_SUMMARY")
    if not target:
        return
    if is_stream(target):
        streams: dict = {}
        one_report_per_stream(f"GITHUB_STEP_SUMMARY {target}", streams, target)
        for report in reports:
            if is_stream(report):
                one_report_per_stream(f"the report {report}", streams, report)
    path = resolved(target)
    why = None
    if path.is_dir():
        why = "is a directory"
    elif not path.parent.is_dir():
        why = "lies in a directory that does not exist"
    elif any(is_run_dir(folder) for folder in path.parents):
        why = "lies inside a gradalign run"
    if why:
        raise ReportRefused(f"GITHUB_STEP_SUMMARY {target} {why}; point it at a file (or unset it)")


def is_step_summary(path: Path, environ: Mapping[str, str]) -> bool:
    """Whether `path` is the job's `$GITHUB_STEP_SUMMARY` (`--markdown "$GITHUB_STEP_SUMMARY"`, a
    common habit): the summary is appended there once, and the file is not overwritten first,
    which wiped earlier steps' summaries and showed this one twice."""
    from ..paths import resolved

    target = environ.get("GITHUB_STEP_SUMMARY")
    if not target:
        return False
    if resolved(path) == resolved(target):
        return True
    try:
        return os.path.samefile(path, target)
    except OSError:
        return False


def append_step_summary(c: Comparison, environ: Mapping[str, str]) -> str | None:
    """Append the Markdown summary to `$GITHUB_STEP_SUMMARY` when it is set; a warning line
    where it cannot be (a full disk, a read-only file), None otherwise. The summary is what the
    job's page shows, not the gate: failing to append it keeps the verdict's exit code and the
    reports (it turned a pass into exit 2 and removed the run's own reports as "stale")."""
    target = environ.get("GITHUB_STEP_SUMMARY")
    if not target:
        return None
    try:
        with open(target, "a", encoding="utf-8") as handle:
            handle.write(to_markdown(c) + "\n")
    except OSError as exc:
        return (
            f"warning: GITHUB_STEP_SUMMARY {target}: cannot append the summary "
            f"({exc.strerror}); the verdict and the other reports stand"
        )
    return None
