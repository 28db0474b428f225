"""The `gradalign` command line: parse, call `gradalign.api`, render, exit code.

Exit codes: 0 aligned, 1 not aligned, 2 bad input (one line on stderr), 3 an internal error (one
line; `--debug` shows the traceback), 130 interrupted (143 on SIGTERM). A crash never looks
like a verdict.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from typer.exceptions import Abort, TyperException

from . import __version__, api, api_golden, errors
from .cli_options import (
    AccumOpt,
    AgainstOpt,
    ConfigOpt,
    FaultOpt,
    GoldenReferenceOpt,
    GoldenRunArg,
    JsonOpt,
    NprocOpt,
    ReferenceOpt,
    SelftestDeviceOpt,
    SelftestKeepOpt,
    SelftestOutOpt,
    SelftestRecordOpt,
    VerifyFilesOpt,
    refuse_empty_paths,
    report_options,
    tolerance_options,
    training_options,
    with_k,
)
from .config import tolerances_from_yaml
from .errors import DISK_ERRORS, BadInput, Terminated, debug_wanted, sigterm_as_interrupt
from .report.terminal import console, last_word, ready_streams, table_console

BAD_INPUT, INTERNAL, INTERRUPTED, TERMINATED = 2, 3, 130, 143
app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
    help="Is a gradient-accumulation run numerically the same training as its large batch? "
    "Exit 0 aligned, 1 not aligned, 2 bad input, 3 internal error, 130 interrupted, "
    "143 terminated.",
)


out_console = console()
err_console = console(stderr=True)
_debug = {"on": debug_wanted(os.environ)}


def _show_version(value: bool) -> None:
    if value:
        out_console.print(f"gradalign {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version", is_eager=True, callback=_show_version, help="print the version and exit"
        ),
    ] = False,
    debug: Annotated[
        bool, typer.Option("--debug", help="show the traceback of an internal error")
    ] = False,
) -> None:
    _debug["on"] = _debug["on"] or debug


def _feedback():
    from .report.progress import RichFeedback

    return RichFeedback(err_console)


def _report_files(reports: dict | None, *read: Path | None):
    """The report files asked for, checked before any work (`report.files.requested`)."""
    from .report.files import requested

    return requested(reports, read)


def _verdict(comparison, files) -> int:
    """Render a comparison, write its reports, and turn its verdict into the exit code."""
    from .judge.results import FAIL
    from .report.files import write_reports
    from .report.table import render

    render(comparison, table_console(files.paths(), out_console, err_console))
    for line in write_reports(comparison, files):
        err_console.print(line, markup=False, emoji=False, soft_wrap=True)
    return 1 if comparison.verdict == FAIL else 0


@app.command()
@training_options
def baseline(
    config: ConfigOpt = None,
    out: Annotated[Path, typer.Option("--out", "-o", help="run directory")] = Path("runs/baseline"),
    reference: ReferenceOpt = "fp64",
    overrides: dict | None = None,
) -> None:
    """Train at batch B for N updates (K=1) and record the run (and its float64 reference)."""
    cfg = api.as_config(config, overrides)
    api.record_baseline(cfg, out, reference=reference, feedback=_feedback())


@app.command()
@report_options
@training_options
def merged(
    accum_steps: AccumOpt = None,
    nproc: NprocOpt = None,
    config: ConfigOpt = None,
    out: Annotated[Path, typer.Option("--out", "-o", help="run directory")] = Path("runs/merged"),
    against: AgainstOpt = None,
    fault: FaultOpt = None,
    trust_run_code: Annotated[
        bool,
        typer.Option(
            "--trust-run-code",
            help="with --against: import the model/data/loss code the baseline's manifest names "
            "(otherwise name it again with --model/--data/--loss)",
        ),
    ] = False,
    overrides: dict | None = None,
    reports: dict | None = None,
) -> None:
    """Train at micro-batch B/K for N*K micro-steps, stepping every K; record the run."""
    overrides = with_k(overrides, accum_steps, nproc)
    files = _report_files(reports, config)
    if against is None:
        if files.paths():
            raise BadInput("report options need --against: a merged run alone is not judged")
        api.record_merged(api.as_config(config, overrides), out, fault=fault, feedback=_feedback())
        return
    comparison = api.merged_against(
        against,
        out,
        overrides=overrides,
        config_file=config,
        fault=fault,
        trust_run_code=trust_run_code,
        reports=files.paths(),
        feedback=_feedback(),
    )
    raise typer.Exit(_verdict(comparison, files))


@app.command("compare")
@report_options
@tolerance_options
def compare_cmd(
    baseline: Annotated[Path, typer.Argument(help="baseline run directory or log")],
    merged: Annotated[
        list[Path],
        typer.Argument(
            help="merged run directory or log; or one log per card (card 0 first)",
            metavar="merged",
        ),
    ],
    accum_steps: Annotated[
        int | None, typer.Option("--accum-steps", "-k", help="K of the merged run (logs)")
    ] = None,
    baseline_accum_steps: Annotated[
        int, typer.Option(help="K of the baseline (a log's, or a merged run's given as BASE)")
    ] = 1,
    card_loss: Annotated[
        str | None,
        typer.Option(
            help="how several card logs' losses add up: mean (each card printed the mean over "
            "its own samples; default) or sum (each card's loss was already divided by the "
            "global item count) " + escape("[mean|sum]")
        ),
    ] = None,
    config: Annotated[
        Path | None, typer.Option("--config", "-c", help="YAML file with a tolerances section")
    ] = None,
    reference: Annotated[
        str | None,
        typer.Option(
            help="a float64 rerun of the baseline to calibrate by (default: the one the "
            "baseline's manifest names); none: use the fixed tolerances"
        ),
    ] = None,
    verify_files: VerifyFilesOpt = False,
    tolerances: dict | None = None,
    reports: dict | None = None,
) -> None:
    """Judge a merged run against its baseline; exit 0 aligned, 1 not aligned, 2 bad input."""
    files = _report_files(reports, config)
    comparison = api.compare(
        baseline,
        merged,
        reference=reference,
        tolerances={**tolerances_from_yaml(config), **(tolerances or {})},
        accum_steps=accum_steps,
        baseline_accum_steps=baseline_accum_steps,
        card_loss=card_loss,
        reports=files.paths(),
        feedback=_feedback(),
        verify_files=verify_files,
    )
    raise typer.Exit(_verdict(comparison, files))


@app.command()
@report_options
@tolerance_options
@training_options
def verify(
    accum_steps: AccumOpt = None,
    nproc: NprocOpt = None,
    config: ConfigOpt = None,
    out: Annotated[Path, typer.Option("--out", "-o", help="directory for both runs")] = Path(
        "runs/verify"
    ),
    fault: FaultOpt = None,
    reference: ReferenceOpt = "fp64",
    overrides: dict | None = None,
    tolerances: dict | None = None,
    reports: dict | None = None,
) -> None:
    """Baseline, merged and compare in one command (the built-in MLP by default)."""
    files = _report_files(reports, config)
    comparison = api.verify(
        api.as_config(config, with_k(overrides, accum_steps, nproc)),
        out,
        fault=fault,
        reference=reference,
        tolerances={**tolerances_from_yaml(config), **(tolerances or {})},
        reports=files.paths(),
        feedback=_feedback(),
    )
    raise typer.Exit(_verdict(comparison, files))


golden_app = typer.Typer(
    no_args_is_help=True,
    help="Golden files: a recorded baseline kept as a small JSON file in the repository, and "
    "runs judged against it (exit 0 aligned, 1 not aligned, 2 bad input or no golden for this "
    "environment).",
)
app.add_typer(golden_app, name="golden")


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
    tolerances: dict | None = None,
    reports: dict | None = None,
) -> None:
    """Judge a run against the golden for its environment; --update accepts it as the golden."""
    files = _report_files(reports, golden)
    outcome = api.golden_check(
        golden,
        run,
        tolerances=tolerances,
        update=update,
        reports=files.paths(),
        feedback=_feedback(),
    )
    if outcome.comparison is None:
        for line in api_golden.first_golden_lines(run, outcome.written, files.paths()):
            out_console.print(line, markup=False)
        raise typer.Exit(0)
    code = _verdict(outcome.comparison, files)
    raise typer.Exit(0 if outcome.written else code)


@app.command()
def selftest(
    out: SelftestOutOpt = Path("runs/selftest"),
    json: JsonOpt = None,
    record: SelftestRecordOpt = "full",
    device: SelftestDeviceOpt = "cpu",
    keep_runs: SelftestKeepOpt = False,
) -> None:
    """Prove the gate: clean setups must pass, every known bug must fail with its own code."""
    from .selftest import render_selftest, run_selftest, write_selftest_json

    reports = [json] if json is not None else []
    options = {"device": device, "record": record, "keep_runs": keep_runs}
    outcome = run_selftest(out, err_console, reports=reports, **options)
    render_selftest(outcome, table_console(reports, out_console, err_console))
    write_selftest_json(outcome, json)
    raise typer.Exit(0 if all(case.ok for case in outcome) else 1)


@app.command()
def version() -> None:
    """Print the gradalign version."""
    out_console.print(__version__)


def main(argv: list[str] | None = None) -> None:
    """Entry point. Bad input is one line on stderr and exit 2; anything unexpected is one line
    and exit 3 (the traceback with --debug); never exit 1, which means "not aligned"."""
    from .report.files import forget_asked

    args = sys.argv[1:] if argv is None else list(argv)
    forget_asked()  # reports asked for by an earlier command of this process are not this one's
    ready_streams(err_console, INTERRUPTED)
    _debug["on"] = debug_wanted(os.environ) or "--debug" in args  # per command, not sticky
    args = [a for a in args if a != "--debug"]  # accepted before or after the command
    try:
        with sigterm_as_interrupt():
            code = refuse_empty_paths(app)(args=args, prog_name="gradalign", standalone_mode=False)
    except TyperException as exc:  # usage errors: unknown option, bad value, missing argument
        if type(exc).__name__ == "NoArgsIsHelpError":  # bare `gradalign` (or a group): typer
            _fail("no command given: the help above lists them", BAD_INPUT)  # printed the help
        _fail(exc.format_message(), getattr(exc, "exit_code", BAD_INPUT) or BAD_INPUT)
    except BadInput as exc:
        _fail(str(exc), BAD_INPUT)
    except (Abort, KeyboardInterrupt):
        code = INTERRUPTED
    except Terminated:
        code = TERMINATED
    except MemoryError:
        _fail("out of memory: the run is too large for this machine; reduce it", BAD_INPUT)
    except OSError as exc:
        if exc.errno not in DISK_ERRORS or _debug["on"]:
            _internal(exc)
        name = str(exc.filename or "")  # a path of thousands of characters, cut
        where = f" ({name if len(name) <= 200 else name[:197] + '...'})" if name else ""
        _fail(f"cannot write or read{where}: {exc.strerror}", BAD_INPUT)
    except RecursionError as exc:
        if _debug["on"]:
            raise
        _fail(f"input nested too deeply to read ({exc})", BAD_INPUT)
    except Exception as exc:  # an interrupt Python wrapped in another exception is one still
        inner = errors.wrapped_interrupt(exc)
        if inner is None:
            _internal(exc)
        code = INTERRUPTED if isinstance(inner, KeyboardInterrupt) else TERMINATED
    if code in (INTERRUPTED, TERMINATED):
        last_word(err_console, errors.INTERRUPTED_LATE)
    sys.exit(code if isinstance(code, int) else 0)


def _internal(exc: BaseException) -> None:
    if _debug["on"]:
        raise exc
    text = " ".join(str(exc).split())[:300]
    _fail(
        f"internal error: {type(exc).__name__}: {text} (this is a gradalign bug: rerun with "
        "--debug for the traceback and report it)",
        INTERNAL,
    )


def _fail(message: str, code: int) -> None:
    from .report.files import remove_stale

    text = " ".join(message.split()) + remove_stale()
    last_word(err_console, f"error: {text or 'bad command line'}")
    sys.exit(code)
