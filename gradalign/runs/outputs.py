"""Outputs never touch inputs: where a command may write, checked before it does any work."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from ..errors import BadInput, ReportRefused
from ..paths import is_stream, resolved
from .writer import ensure_parent_writable

NAME_MAX = 255  # bytes in one file name on Linux, macOS and Windows file systems


def _inside(path: Path, other: Path) -> bool:
    return path == other or other in path.parents


def check_outputs(
    outputs: Iterable[os.PathLike[str] | str],
    inputs: Iterable[os.PathLike[str] | str],
    reports: Iterable[os.PathLike[str] | str] = (),
    kind: str = "report",
) -> None:
    """Refuse an output run that is, holds or lies inside an input (a run or a log), and a report
    file that would land on or inside any run of the command, or on a directory. `kind`: what
    the report files are called in a refusal (a golden file is checked as one)."""
    ins = [(Path(p), resolved(p)) for p in inputs]
    outs = [(Path(p), resolved(p)) for p in outputs]
    for shown, out in outs:
        for given, source in ins:
            if _inside(out, source) or _inside(source, out):
                raise BadInput(
                    f"output {shown} would overwrite the input {given}; choose another output"
                )
    seen: dict[Path, os.PathLike[str] | str] = {}
    streams: dict[tuple[int, int], os.PathLike[str] | str] = {}
    for report in reports:
        if len(os.fsencode(Path(report).name)) > NAME_MAX:
            raise ReportRefused(f"{kind} {report}: the file name is longer than {NAME_MAX} bytes")
        if is_stream(report):  # /dev/stdout, a pipe, /dev/null: written into as it is
            one_report_per_stream(str(report), streams, report)
            continue
        target = resolved(report)
        if os.path.islink(report) and not target.parent.is_dir():
            raise ReportRefused(
                f"{kind} {report} is a link to {target}, in a folder that does not exist: a "
                "report creates no folder through a link; make the folder or give a plain path"
            )
        if Path(report).is_dir():
            raise ReportRefused(f"{kind} {report} is a directory; give a file name")
        if target in seen:
            raise ReportRefused(f"reports {seen[target]} and {report} are the same file; give two")
        for other, given in seen.items():  # `--json X --plot X`: X both a file and a folder
            if _inside(target, other) or _inside(other, target):
                raise ReportRefused(
                    f"{kind} {report} would be written inside {given} or over it, which another "
                    "report needs; give them separate paths"
                )
        seen[target] = report
        for given, run in ins + outs:
            if _inside(target, run):
                raise ReportRefused(
                    f"{kind} {report} would be written over or inside the input {given}; "
                    "write it elsewhere"
                )
        for given, run in outs:  # `verify --out D --json D`: D is to hold the runs
            if _inside(run, target):
                raise ReportRefused(
                    f"{kind} {report} is the folder the run {given} is to be written in; give "
                    "the report a file name of its own"
                )
        try:
            ensure_parent_writable(target, f"{kind} {report}")
        except BadInput as exc:
            raise ReportRefused(str(exc)) from None


def one_report_per_stream(named: str, streams: dict, report: os.PathLike[str] | str) -> None:
    """Refuse a second report into a stream another report writes (`--json /dev/stdout --junit
    /dev/stdout`: the two glued together parse as neither); /dev/null takes any number."""
    try:
        info = os.stat(report)
        if os.path.samefile(report, os.devnull):
            return
    except OSError:
        return  # the writer says what is wrong with it
    key = (info.st_dev, info.st_ino)
    if key in streams:
        raise ReportRefused(
            f"{streams[key]} and {named} would both be written into one stream, where they run "
            "together; give one of them a file"
        )
    streams[key] = named
