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

from . import __version__, api, cli_render, errors
from .cli_golden import golden_app
from .cli_options import (
    AccumOpt,
    AgainstOpt,
    ConfigOpt,
    FaultOpt,
    JsonOpt,
    NprocOpt,
    ReferenceOpt,
    SelftestDeviceOpt,
    SelftestKeepOpt,
    SelftestOutOpt,
    SelftestRecordOpt,
    StrictOpt,
    VerifyFilesOpt,
    refuse_empty_paths,
    report_options,
    reports_in_argv,
    tolerance_options,
    training_options,
    with_k,
)
from .cli_render import err_console, feedback, out_console, report_files, verdict
from .config import tolerances_from_yaml
from .errors import DISK_ERRORS, BadInput, Terminated, cut, debug_wanted, sigterm_as_interrupt
from .report.terminal import last_word, ready_streams, table_console

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
    cli_render.debug["on"] = cli_render.debug["on"] or debug


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
    api.record_baseline(cfg, out, reference=reference, feedback=feedback())


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
    strict: StrictOpt = False,
    overrides: dict | None = None,
    reports: dict | None = None,
) -> None:
    """Train at micro-batch B/K for N*K micro-steps, stepping every K; record the run."""
    overrides = with_k(overrides, accum_steps, nproc)
    files = report_files(reports, config)
    if against is None:
        if files.paths() or strict:
            asked = "--strict needs" if strict else "report options need"
            raise BadInput(f"{asked} --against: a merged run alone is not judged")
        api.record_merged(api.as_config(config, overrides), out, fault=fault, feedback=feedback())
        return
    comparison = api.merged_against(
        against,
        out,
        overrides=overrides,
        config_file=config,
        fault=fault,
        trust_run_code=trust_run_code,
        reports=files.paths(),
        feedback=feedback(),
        strict=strict,
    )
    raise typer.Exit(verdict(comparison, files))


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
            help="a more precise rerun of the baseline to calibrate by: float64 (or float32 "
            "without autocast, for runs under it; default: the one the baseline's manifest "
            "names); none: use the fixed tolerances"
        ),
    ] = None,
    verify_files: VerifyFilesOpt = False,
    strict: StrictOpt = False,
    tolerances: dict | None = None,
    reports: dict | None = None,
) -> None:
    """Judge a merged run against its baseline; exit 0 aligned, 1 not aligned, 2 bad input."""
    files = report_files(reports, config)
    comparison = api.compare(
        baseline,
        merged,
        reference=reference,
        tolerances={**tolerances_from_yaml(config), **(tolerances or {})},
        accum_steps=accum_steps,
        baseline_accum_steps=baseline_accum_steps,
        card_loss=card_loss,
        reports=files.paths(),
        feedback=feedback(),
        verify_files=verify_files,
        strict=strict,
    )
    raise typer.Exit(verdict(comparison, files))


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
    strict: StrictOpt = False,
    overrides: dict | None = None,
    tolerances: dict | None = None,
    reports: dict | None = None,
) -> None:
    """Baseline, merged and compare in one command (the built-in MLP by default)."""
    files = report_files(reports, config)
    comparison = api.verify(
        api.as_config(config, with_k(overrides, accum_steps, nproc)),
        out,
        fault=fault,
        reference=reference,
        tolerances={**tolerances_from_yaml(config), **(tolerances or {})},
        reports=files.paths(),
        feedback=feedback(),
        strict=strict,
    )
    raise typer.Exit(verdict(comparison, files))


app.add_typer(golden_app, name="golden")


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
    cli_render.debug["on"] = (
        debug_wanted(os.environ) or "--debug" in args
    )  # per command, not sticky
    args = [a for a in args if a != "--debug"]  # accepted before or after the command
    try:
        with sigterm_as_interrupt():
            code = refuse_empty_paths(app)(args=args, prog_name="gradalign", standalone_mode=False)
    except TyperException as exc:  # usage errors: unknown option, bad value, missing argument
        if type(exc).__name__ == "NoArgsIsHelpError":  # bare `gradalign` (or a group): typer
            _fail("no command given: the help above lists them", BAD_INPUT)  # printed the help
        refused = _ask_reports(reports_in_argv(args))
        _fail(exc.format_message(), getattr(exc, "exit_code", BAD_INPUT) or BAD_INPUT, refused)
    except BadInput as exc:
        _fail(str(exc), BAD_INPUT, refused=isinstance(exc, errors.ReportRefused))
    except (Abort, KeyboardInterrupt):
        code = INTERRUPTED
    except Terminated:
        code = TERMINATED
    except MemoryError:
        _fail("out of memory: the run is too large for this machine; reduce it", BAD_INPUT)
    except OSError as exc:
        if exc.errno not in DISK_ERRORS or cli_render.debug["on"]:
            _internal(exc)
        name = str(exc.filename or "")  # a path of thousands of characters, cut
        where = f" ({cut(name, 200)})" if name else ""
        _fail(f"cannot write or read{where}: {exc.strerror}", BAD_INPUT)
    except RecursionError as exc:
        if cli_render.debug["on"]:
            raise
        _fail(f"input nested too deeply to read ({exc})", BAD_INPUT)
    except Exception as exc:  # an interrupt Python wrapped in another exception is one still
        inner = errors.wrapped_interrupt(exc)
        if inner is None:
            _internal(exc)
        code = INTERRUPTED if isinstance(inner, KeyboardInterrupt) else TERMINATED
    if code in (INTERRUPTED, TERMINATED):
        from .report.files import written_whole

        whole = written_whole()  # held until its files were in place: they were written
        last_word(
            err_console,
            f"interrupted after {whole}" if whole else errors.INTERRUPTED_LATE,
        )
    sys.exit(code if isinstance(code, int) else 0)


def _ask_reports(reports: dict[str, Path]) -> bool:
    """Ask for the reports a command line that could not be parsed names, as the command would
    have; whether a check refused them (then none is written)."""
    if not reports:
        return False
    try:
        report_files(reports)
    except BadInput:
        return True
    return False


def _internal(exc: BaseException) -> None:
    if cli_render.debug["on"]:
        raise exc
    text = " ".join(str(exc).split())[:300]
    _fail(
        f"internal error: {type(exc).__name__}: {text} (this is a gradalign bug: rerun with "
        "--debug for the traceback and report it)",
        INTERNAL,
    )


def _fail(message: str, code: int, refused: bool = False) -> None:
    from .report.files import after_error

    text = " ".join(message.split()) or "bad command line"
    try:  # the error's reports: never what decides the exit code (an exception here was 1)
        removed, lines = after_error(text, code, refused)
    except Exception:
        removed, lines = "", []
    last_word(err_console, f"error: {text}{removed}")
    for line in lines:
        last_word(err_console, line)
    sys.exit(code)
