"""The `gradalign` command line: a thin layer over the library (train, store, compare, report)."""

from __future__ import annotations

import functools
import inspect
import sys
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from typer.exceptions import Abort, TyperException

from . import __version__, api
from .config import FIELDS, base_type, tolerances_from_yaml
from .errors import BadInput

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Is a gradient-accumulation run numerically the same training as its large batch?",
)
_WIDTH = None if sys.stdout.isatty() else 132  # CI logs: wide enough for the table
out_console = Console(highlight=False, width=_WIDTH)
err_console = Console(stderr=True, highlight=False, width=_WIDTH)

ConfigOpt = Annotated[Path | None, typer.Option("--config", "-c", help="YAML config file")]
JsonOpt = Annotated[Path | None, typer.Option("--json", help="also write the report as JSON")]
AccumOpt = Annotated[
    int | None, typer.Option("--accum-steps", "-k", help="micro-steps per update K")
]
FaultOpt = Annotated[
    str | None,
    typer.Option(
        "--fault",
        help="inject a known accumulation bug into the merged run, to prove the gate fails "
        "(see `gradalign selftest`)",
    ),
]
ReferenceOpt = Annotated[
    str,
    typer.Option(
        "--reference",
        help="fp64: also record a float64 rerun of the baseline (BASE-fp64) as the noise "
        "floor; none: judge by the dtype's fixed tolerances",
    ),
]
_TRAINING_KEYS = [name for name in FIELDS if name != "accum_steps"]
_TOLERANCE_HELP = {
    "loss_atol": "absolute loss tolerance",
    "loss_rtol": "loss tolerance relative to the baseline loss",
    "weight_rtol": "weight error allowed, relative to how far training moved the weights",
    "weight_atol": "absolute weight tolerance per element (scaled by sqrt(n))",
    "grad_rtol": "gradient error allowed, relative to the gradient's norm",
    "noise_factor": "with a reference: error allowed, as a multiple of the baseline's own",
    "noise_floor": "with a reference: error always allowed, in machine epsilons of the tensor",
}


def _extend_signature(extra: dict[str, tuple[type, str, str]], target: str) -> Callable:
    """Add one `--name` option per entry to a command; their values arrive as dict `target`.

    The options are generated from one table (the config dataclass, the tolerances), so a key
    exists in YAML and on the command line under the same name without being written twice.
    """

    def decorate(fn: Callable) -> Callable:
        signature = inspect.signature(fn)
        hints = typing.get_type_hints(fn, include_extras=True)  # resolve string annotations
        params = [
            p.replace(annotation=hints.get(p.name, p.annotation))
            for p in signature.parameters.values()
            if p.name != target
        ]
        for name, (kind, help_text, panel) in extra.items():
            option = typer.Option(
                f"--{name.replace('_', '-')}",
                help=help_text,
                rich_help_panel=panel,
                show_default=False,
            )
            params.append(
                inspect.Parameter(
                    name,
                    inspect.Parameter.KEYWORD_ONLY,
                    default=None,
                    annotation=Annotated[kind | None, option],
                )
            )

        @functools.wraps(fn)
        def wrapper(**kwargs: Any) -> Any:
            values = {name: kwargs.pop(name) for name in extra}
            kwargs[target] = {k: v for k, v in values.items() if v is not None}
            return fn(**kwargs)

        wrapper.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
        return wrapper

    return decorate


def _help(name: str) -> str:
    choices = FIELDS[name].metadata["choices"]
    text = FIELDS[name].metadata["help"]
    return f"{text} [{'|'.join(choices)}]" if choices else text


training_options = _extend_signature(
    {name: (base_type(name), _help(name), "Training") for name in _TRAINING_KEYS},
    "overrides",
)
tolerance_options = _extend_signature(
    {name: (float, text, "Tolerances") for name, text in _TOLERANCE_HELP.items()}, "tolerances"
)


def _feedback():
    from .report.progress import RichFeedback

    return RichFeedback(err_console)


def _verdict(comparison, json_path: Path | None) -> int:
    """Render a comparison, write its JSON, and turn its verdict into the exit code."""
    from .judge.results import FAIL
    from .report.json_report import write_json
    from .report.table import render

    render(comparison, out_console)
    if json_path is not None:
        write_json(comparison, json_path)
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
    api.record_baseline(
        api.as_config(config, overrides), out, reference=reference, feedback=_feedback()
    )


@app.command()
@training_options
def merged(
    accum_steps: AccumOpt = None,
    config: ConfigOpt = None,
    out: Annotated[Path, typer.Option("--out", "-o", help="run directory")] = Path("runs/merged"),
    against: Annotated[
        Path | None,
        typer.Option(help="a baseline run: reuse its config, then compare against it"),
    ] = None,
    json: JsonOpt = None,
    fault: FaultOpt = None,
    overrides: dict | None = None,
) -> None:
    """Train at micro-batch B/K for N*K micro-steps, stepping every K; record the run."""
    overrides = {**overrides, **({} if accum_steps is None else {"accum_steps": accum_steps})}
    if against is not None:
        cfg = api.recorded_config(against, overrides, config)
    else:
        cfg = api.as_config(config, overrides)
    tolerances = api.check_tolerances(tolerances_from_yaml(config))
    path = api.record_merged(cfg, out, fault=fault, feedback=_feedback())
    if against is not None:
        raise typer.Exit(_verdict(api.compare(against, path, tolerances=tolerances), json))


@app.command("compare")
@tolerance_options
def compare_cmd(
    baseline: Annotated[Path, typer.Argument(help="baseline run directory or log")],
    merged: Annotated[Path, typer.Argument(help="merged run directory or log")],
    accum_steps: Annotated[
        int | None, typer.Option("--accum-steps", "-k", help="K of the merged run (logs)")
    ] = None,
    baseline_accum_steps: Annotated[int, typer.Option(help="K of the baseline, for logs")] = 1,
    config: Annotated[
        Path | None, typer.Option("--config", "-c", help="YAML file with a tolerances section")
    ] = None,
    json: JsonOpt = None,
    reference: Annotated[
        str | None,
        typer.Option(
            help="a float64 rerun of the baseline to calibrate by (default: the one the "
            "baseline's manifest names); none: use the fixed tolerances"
        ),
    ] = None,
    tolerances: dict | None = None,
) -> None:
    """Judge a merged run against its baseline; exit 0 aligned, 1 not aligned, 2 bad input."""
    comparison = api.compare(
        baseline,
        merged,
        reference=reference,
        tolerances={**tolerances_from_yaml(config), **(tolerances or {})},
        accum_steps=accum_steps,
        baseline_accum_steps=baseline_accum_steps,
    )
    raise typer.Exit(_verdict(comparison, json))


@app.command()
@tolerance_options
@training_options
def verify(
    accum_steps: AccumOpt = None,
    config: ConfigOpt = None,
    out: Annotated[Path, typer.Option("--out", "-o", help="directory for both runs")] = Path(
        "runs/verify"
    ),
    json: JsonOpt = None,
    fault: FaultOpt = None,
    reference: ReferenceOpt = "fp64",
    overrides: dict | None = None,
    tolerances: dict | None = None,
) -> None:
    """Baseline, merged and compare in one command (built-in default mirrors the seed)."""
    overrides = {**overrides, **({} if accum_steps is None else {"accum_steps": accum_steps})}
    comparison = api.verify(
        api.as_config(config, overrides),
        out,
        fault=fault,
        reference=reference,
        tolerances={**tolerances_from_yaml(config), **(tolerances or {})},
        feedback=_feedback(),
    )
    raise typer.Exit(_verdict(comparison, json))


@app.command()
def selftest(
    out: Annotated[Path, typer.Option("--out", "-o", help="directory for the runs")] = Path(
        "runs/selftest"
    ),
    json: JsonOpt = None,
) -> None:
    """Prove the gate: clean setups must pass, every known bug must fail with its own code."""
    from .selftest import render_selftest, run_selftest, write_selftest_json

    outcome = run_selftest(out, err_console)
    render_selftest(outcome, out_console)
    if json is not None:
        write_selftest_json(outcome, json)
    raise typer.Exit(0 if all(case.ok for case in outcome) else 1)


@app.command()
def version() -> None:
    """Print the gradalign version."""
    out_console.print(__version__)


def main(argv: list[str] | None = None) -> None:
    """Entry point: bad input is one line on stderr and exit 2, never a traceback."""
    try:
        code = app(args=argv, prog_name="gradalign", standalone_mode=False)
    except TyperException as exc:  # usage errors: unknown option, bad value, missing argument
        _fail(exc.format_message(), getattr(exc, "exit_code", 2) or 2)
    except BadInput as exc:
        _fail(str(exc), 2)
    except (Abort, KeyboardInterrupt):
        code = 130
    if code == 130:
        err_console.print("interrupted: no partial run was left in place")
    sys.exit(code if isinstance(code, int) else 0)


def _fail(message: str, code: int) -> None:
    err_console.print(f"error: {' '.join(message.split())}", soft_wrap=True, markup=False)
    sys.exit(code)
