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

from . import __version__
from .config import FIELDS, TrainConfig, base_type, load_config, tolerances_from_yaml
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


def _preflight(config: TrainConfig, outs: list[Path], reference: str = "none") -> None:
    """Check every input before any training, then warn about layers that make B/K differ from
    B and show the numeric settings."""
    from .record.preflight import determinism_line, warnings_for
    from .record.trainer import preflight, reference_path
    from .runs.writer import ensure_writable

    if reference not in ("fp64", "none"):
        raise BadInput(f"--reference must be fp64 or none, got {reference!r}")
    if reference == "fp64":
        outs = [*outs, reference_path(outs[0])]
    for out in outs:
        ensure_writable(out)
    facts, env = preflight(config)
    for line in warnings_for(facts):
        err_console.print(f"warning: {line}", markup=False, soft_wrap=True)
    err_console.print(f"settings: {determinism_line(env)}", markup=False, soft_wrap=True)


def _train(
    config: TrainConfig,
    out: Path,
    label: str,
    fault: str | None = None,
    reference: str | None = None,
) -> Path:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    from .record.faults import get_fault
    from .record.trainer import train

    injected = get_fault(fault, config)

    with Progress(
        TextColumn(f"{label} (K={config.accum_steps})"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("updates"),
        console=err_console,
        transient=True,
        disable=not err_console.is_terminal,  # no bar, and no stray lines, in CI logs
    ) as progress:
        task = progress.add_task(label, total=config.updates)
        path = train(
            config,
            out,
            progress=lambda _: progress.advance(task),
            fault=injected,
            reference=reference,
        )
    extra = f", fault {fault}" if fault else ""
    err_console.print(
        f"{label}: {config.updates} updates x K={config.accum_steps}{extra} -> {path}"
    )
    return path


def _record_baseline(config: TrainConfig, out: Path, reference: str) -> Path:
    """The baseline (K=1) and, unless `reference` is none, its float64 rerun beside it."""
    from .record.trainer import reference_config, reference_path

    link = None
    if reference == "fp64" and config.param_dtype != "float64":
        ref_dir = reference_path(out)
        _train(reference_config(config), ref_dir, "reference (fp64)")
        link = f"../{ref_dir.name}"
    return _train(config.replace(accum_steps=1), out, "baseline", reference=link)


def _tolerances(config: Path | None, options: dict[str, Any] | None) -> dict[str, Any]:
    """The tolerance overrides from the config file and the options, validated before any work."""
    from .judge.tolerances import for_dtype

    merged = {**tolerances_from_yaml(config), **(options or {})}
    for_dtype("float32", merged)
    return merged


def _judge(
    baseline: Path,
    merged: Path,
    accum_steps: int | None,
    baseline_accum_steps: int,
    tolerances: dict[str, Any],
    json_path: Path | None,
    reference: str | None = None,
) -> int:
    from .judge.compare import FAIL, compare
    from .report.table import render, write_json
    from .runs.sources import open_reference, open_run

    base_run = open_run(baseline, baseline_accum_steps, role="baseline")
    merged_run = open_run(merged, accum_steps, role="merged")
    ref_run, note = open_reference(reference, base_run)
    comparison = compare(base_run, merged_run, tolerances, ref_run)
    if note:
        comparison.notes.append(note)
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
    cfg = load_config(config, overrides).replace(accum_steps=1)
    _preflight(cfg, [out], reference)
    _record_baseline(cfg, out, reference)


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
    from .record.faults import get_fault

    if against is not None:
        from .runs.reader import read_manifest

        recorded = read_manifest(against).get("config", {})
        # Reuse the baseline's experiment (B, N, seed, optimizer...), but not its K of 1.
        recorded = {k: v for k, v in recorded.items() if k in FIELDS and k != "accum_steps"}
        cfg = load_config(config, {**recorded, **overrides})
    else:
        cfg = load_config(config, overrides)
    if accum_steps is not None:
        cfg = cfg.replace(accum_steps=accum_steps)
    tolerances = _tolerances(config, None)
    get_fault(fault, cfg)
    _preflight(cfg, [out])
    path = _train(cfg, out, "merged", fault)
    if against is not None:
        raise typer.Exit(_judge(against, path, None, 1, tolerances, json))


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
    merged_tolerances = {**tolerances_from_yaml(config), **(tolerances or {})}
    raise typer.Exit(
        _judge(
            baseline,
            merged,
            accum_steps,
            baseline_accum_steps,
            merged_tolerances,
            json,
            reference,
        )
    )


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
    from .record.faults import get_fault

    cfg = load_config(config, overrides)
    if accum_steps is not None:
        cfg = cfg.replace(accum_steps=accum_steps)
    checked_tolerances = _tolerances(config, tolerances)
    get_fault(fault, cfg)  # refuse an inapplicable fault before any training
    _preflight(cfg, [out / "baseline", out / "merged"], reference)
    base_path = _record_baseline(cfg, out / "baseline", reference)
    merged_path = _train(cfg, out / "merged", "merged", fault)
    raise typer.Exit(_judge(base_path, merged_path, None, 1, checked_tolerances, json))


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
