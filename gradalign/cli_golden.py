"""`gradalign golden write` and `gradalign golden check`: a recorded baseline kept as a small
JSON file in the repository, and runs judged against it."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Annotated

import typer

from . import api
from .cli_options import (
    GoldenReferenceOpt,
    GoldenRunArg,
    StrictOpt,
    report_options,
    tolerance_options,
)
from .cli_render import feedback, out_console, report_files, verdict

golden_app = typer.Typer(
    no_args_is_help=True,
    help="Golden files: a recorded baseline kept as a small JSON file in the repository, and "
    "runs judged against it (exit 0 aligned, 1 not aligned, 2 bad input or no golden for this "
    "environment).",
)


@golden_app.command("write")
def golden_write(
    run: GoldenRunArg,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            "-o",
            help="a .json file, or a directory for <environment key>.json (default golden/)",
        ),
    ] = None,
    reference: GoldenReferenceOpt = None,
) -> None:
    """Keep a recorded baseline and its noise as a small, reviewable golden file (default
    golden/<environment key>.json)."""
    path = api.golden_write(run, out, reference=reference)
    out_console.print(f"golden: {path} ({path.stat().st_size / 1024:.1f} kB)", markup=False)


@golden_app.command("check")
@report_options
@tolerance_options
def golden_check(
    golden: Annotated[Path, typer.Argument(help="a golden file, or a directory of them")],
    run: Annotated[Path, typer.Argument(help="the run directory to judge")],
    update: Annotated[
        bool,
        typer.Option(
            "--update",
            help="accept the run as the golden afterwards: exit 0 once written, whatever the "
            "verdict",
        ),
    ] = False,
    strict: StrictOpt = False,
    tolerances: dict | None = None,
    reports: dict | None = None,
) -> None:
    """Judge a run against the golden for its environment; --update accepts it as the golden."""
    files = report_files(reports, golden)
    outcome = api.golden_check(
        golden,
        run,
        tolerances=tolerances,
        update=update,
        reports=files.paths(),
        feedback=feedback(),
        strict=strict,
    )
    if outcome.comparison is None:
        for line in first_golden_lines(run, outcome.written, files.paths(), golden):
            out_console.print(line, markup=False)
        raise typer.Exit(0)
    code = verdict(outcome.comparison, files)
    raise typer.Exit(0 if outcome.written else code)


def first_golden_lines(
    run: Path, written: Path, reports: Sequence[Path], golden: Path | None = None
) -> list[str]:
    """What `golden check --update` says where it made the first golden for the environment:
    nothing was judged, so no report was written (one would show checks that never ran). Where
    `golden` named a file of another environment's golden, which stays, the check that names
    it will not find this one: said."""
    from .report.files import remove_ours

    lines = [f"accepted {run} as the golden: wrote {written}"]
    if golden is not None and golden.is_file() and written.resolve() != golden.resolve():
        lines.append(
            f"note: {golden} holds another environment's golden and stays as it is; a check "
            f"that names that file finds no golden for this run's environment: name the folder "
            f"{golden.parent} instead, which holds each environment's golden"
        )
    if reports:
        removed = [path for path in reports if remove_ours(path)]  # no earlier verdict stays
        lines.append(
            f"note: no report written ({', '.join(str(p) for p in reports)}): there was no "
            "golden for this environment to judge the run against; the run is now that golden"
            + (f"; removed the earlier reports there ({len(removed)})" if removed else "")
        )
    return lines
