"""What a command that ends in error (exit 2, bad input; 3, an internal error) leaves at the
report paths it was asked for. The JSON report, the JUnit file and the Markdown report say the
error: a CI job that reads them shows it, where a missing file showed "no test results" and an
earlier run's report showed that run's verdict. In a GitHub Actions job the step summary gets the
same few lines and one `::error` line names it. The HTML report and the plots of an earlier run
are removed. A path that holds anything but a report of this tool (or an empty file) is left as it
is: the error may be that refusal."""

from __future__ import annotations

import json
import os
import xml.etree.ElementTree as ET
from collections.abc import Callable, Mapping
from pathlib import Path

from .. import __version__
from ..errors import BadInput
from ..paths import is_stream
from .output import printable, write_text_atomic

ERROR = "error"  # the verdict a JSON report of an error carries
_KIND = {2: "bad input", 3: "internal error"}


def kind(code: int) -> str:
    return _KIND.get(code, f"exit {code}")


def error_json(message: str, code: int) -> str:
    """The JSON report of an error: the verdict `error`, the exit code, the message; no checks
    were made and nothing was diagnosed."""
    data = {
        "gradalign": __version__,
        "verdict": ERROR,
        "exit_code": code,
        "error": printable(message),
        "checks": [],
        "diagnosis": [],
    }
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


def error_junit(message: str, code: int) -> str:
    """JUnit XML with one `<testcase>` holding an `<error>`, as pytest writes a collection error:
    CI test reporters show it as an error, not as a pass or a missing file."""
    from .junit import _clean

    counts = {"tests": "1", "failures": "0", "errors": "1", "skipped": "0", "time": "0.000"}
    root = ET.Element("testsuites", {"name": "gradalign", **counts})
    suite = ET.SubElement(root, "testsuite", {"name": "gradalign", **counts})
    case = ET.SubElement(
        suite, "testcase", {"classname": "gradalign", "name": "command", "time": "0.000"}
    )
    error = ET.SubElement(case, "error", {"message": _clean(message), "type": kind(code)})
    error.text = _clean(f"exit {code} ({kind(code)}): {message}")
    ET.indent(root)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(root, "unicode") + "\n"


def error_markdown(message: str, code: int) -> str:
    from .markdown import _cell

    return (
        f"### ⚠️ gradalign: ERROR\n\n{_cell(message)}\n\n"
        f"Exit code {code} ({kind(code)}): nothing was judged.\n"
    )


_TEXTS: dict[str, Callable[[str, int], str]] = {
    "json": error_json,
    "junit": error_junit,
    "markdown": error_markdown,
}


def leave_error(
    asked: list, cleared: list, message: str, code: int, environ: Mapping[str, str] | None = None
) -> tuple[list[Path], list[str]]:
    """Write the error at each JSON, JUnit and Markdown path of the `cleared` report sets (those
    of `asked` that passed the checks before any work) that a report may take; remove this
    tool's earlier reports at the others (HTML, plots, a refused set's, a path the error could
    not be written to); append the error to the job's step summary. Returns the paths removed
    and the lines for stderr (the `::error` line of a GitHub Actions job)."""
    from .files import remove_ours
    from .github import in_actions, is_step_summary

    environ = os.environ if environ is None else environ
    removed: list[Path] = []
    done: set[str] = set()  # a path asked for twice (refused as such) is written once
    for files in asked:
        for name, path in files.named_paths():
            real = os.path.realpath(path)
            if real in done or is_step_summary(path, environ):
                continue  # the step summary holds other steps' lines: appended to below
            done.add(real)
            text = _TEXTS.get(name) if any(files is c for c in cleared) else None
            if text is not None and _takes_a_report(path):
                try:
                    write_text_atomic(Path(path), text(message, code))
                    continue
                except (BadInput, OSError):
                    pass
            if remove_ours(Path(path)):
                removed.append(Path(path))
    lines: list[str] = []
    if in_actions(environ):
        _append_summary(message, code, environ)
        lines.append(_annotation(message, code))
    return removed, lines


def _takes_a_report(path: Path) -> bool:
    """Whether a report may be written at `path`: a stream, or in a folder that exists (an error
    creates none) outside every run, nothing yet, an empty file or a report of this tool (the
    rules before any work: `files.check_replaceable`; a run is checked where it is opened,
    which may be the error)."""
    from ..runs.layout import is_run_dir
    from .files import replaceable

    if is_stream(path):
        return True
    real = Path(os.path.realpath(path))
    if not real.parent.is_dir() or any(is_run_dir(folder) for folder in real.parents):
        return False
    return not real.is_dir() and replaceable(real)


def _append_summary(message: str, code: int, environ: Mapping[str, str]) -> None:
    target = environ.get("GITHUB_STEP_SUMMARY")
    if not target:
        return
    try:
        with open(target, "a", encoding="utf-8") as handle:
            handle.write(error_markdown(message, code) + "\n")
    except OSError:
        pass  # the job's page, not the gate: the error line and the exit code stand


def _annotation(message: str, code: int) -> str:
    from .github import _data, _property

    return f"::error title={_property(f'gradalign: {kind(code)}')}::{_data(message)}"
