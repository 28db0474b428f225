"""The command line's options: one table (the config dataclass, the tolerances) generates them, so
a key exists in YAML and on the command line under the same name without being written twice."""

from __future__ import annotations

import functools
import inspect
import os
import typing
from collections.abc import Callable
from pathlib import Path, PurePath
from typing import Annotated, Any

import typer
from rich.markup import escape

from .config import FIELDS, base_type
from .paths import DASH_PATH, EMPTY_PATH
from .record.faults import FAULTS

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
        + escape(f"[{' | '.join(FAULTS)}]"),
    ),
]
AgainstOpt = Annotated[
    Path | None,
    typer.Option(
        help="a baseline run directory, or a golden file (or a folder of them, the one for "
        "this environment is chosen): reuse its config, then judge against it"
    ),
]
GoldenRunArg = Annotated[
    Path,
    typer.Argument(
        help="a recorded run directory with full snapshots (a baseline, or a merged run "
        "accepted as the golden), from the built-in trainer or a Recorder"
    ),
]
GoldenReferenceOpt = Annotated[
    str | None,
    typer.Option(
        help="its more precise rerun (float64, or float32 without autocast), kept as the "
        "noise floor (default: the one its manifest names); none for the fixed tolerances"
    ),
]
ReferenceOpt = Annotated[
    str,
    typer.Option(
        "--reference",
        help="fp64: also record a float64 rerun of the baseline (BASE-fp64) as the noise "
        "floor; none: judge by the dtype's fixed tolerances " + escape("[fp64|none]"),
    ),
]
VerifyFilesOpt = Annotated[
    bool,
    typer.Option(
        "--verify-files",
        help="first check every file's checksum (XXH3-128 or SHA-256) against its manifest (the "
        "judge checks each tensor's recorded fingerprint as it reads it either way)",
    ),
]
StrictOpt = Annotated[
    bool,
    typer.Option(
        "--strict",
        help="exit 1 where the report warns that a check could not fail or could not see a bug "
        "of the size it names (warnings as failures, code warned: for a gate)",
    ),
]
SelftestOutOpt = Annotated[Path, typer.Option("--out", "-o", help="directory for the runs")]
SelftestKeepOpt = Annotated[
    bool,
    typer.Option(
        "--keep-runs",
        help="keep every case's runs (by default only those of the cases that did not go as "
        "expected stay, with their baselines)",
    ),
]
SelftestDeviceOpt = Annotated[
    str, typer.Option("--device", help="where every case trains: cpu, cuda or auto")
]
SelftestRecordOpt = Annotated[
    str,
    typer.Option(
        "--record",
        help="record every run in full or with sketches (the verdicts must not change) "
        + escape("[full|sketch]"),
    ),
]
NprocOpt = Annotated[
    int | None,
    typer.Option(
        "--nproc",
        help="train the merged run as W data-parallel ranks (torch.distributed: gloo on CPU, "
        "nccl on CUDA; each rank B/(W*K) rows per micro-step); the baseline stays one process",
    ),
]
_TRAINING_KEYS = [name for name in FIELDS if name not in ("accum_steps", "nproc")]
_TOLERANCE_HELP = {
    "loss_atol": "absolute loss tolerance",
    "loss_rtol": "loss tolerance relative to the baseline loss (below 1)",
    "weight_rtol": "weight error allowed, relative to how far training moved the weights (below 1)",
    "weight_atol": "absolute weight tolerance per element (scaled by sqrt(n))",
    "grad_rtol": "gradient error allowed, relative to the gradient's norm (below 1)",
    "grad_rtol_apart": "without a reference: grad_rtol at updates entered with weights that "
    "differ between the runs (16-bit compute: wider; below 1)",
    "loss_rtol_apart": "without a reference: loss_rtol at updates entered with weights that "
    "differ between the runs (16-bit compute: wider; below 1)",
    "noise_factor": "with a reference: error allowed, as a multiple of the baseline's own "
    "(below 100)",
    "noise_floor": "with a reference: error always allowed, in machine epsilons of the tensor "
    "(below 128)",
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
    return escape(f"{text} [{' | '.join(choices)}]") if choices else text


_REPORT_HELP = {
    "json": "also write the report as JSON",
    "junit": "also write JUnit XML: one testsuite per comparison, one testcase per check",
    "markdown": "also write a Markdown summary (appended to $GITHUB_STEP_SUMMARY when set)",
    "plot": "also write loss, error and err/allowed plots (PNG) into this directory "
    + escape("[needs gradalign[plot]]"),
    "html": "also write one self-contained HTML report with the plots embedded",
}

training_options = _extend_signature(
    {name: (base_type(name), _help(name), "Training") for name in _TRAINING_KEYS},
    "overrides",
)
tolerance_options = _extend_signature(
    {name: (float, text, "Tolerances") for name, text in _TOLERANCE_HELP.items()}, "tolerances"
)
report_options = _extend_signature(
    {name: (Path, text, "Reports") for name, text in _REPORT_HELP.items()}, "reports"
)


def refuse_empty_paths(app: typer.Typer) -> Any:
    """The app's command with every path option and argument refusing "": typer turns it into
    Path("."), so `-o ""` would record into (and `compare ""` read) the current directory; and
    "-", which made a file named "-" where a user expected stdout. Checked on the raw value of
    any parameter that typer converts to a path, in every command at once."""
    command = typer.main.get_command(app)
    pending = [command]
    while pending:
        current = pending.pop()
        for param in current.params:
            param.process_value = _nonempty(param, param.process_value)  # type: ignore[method-assign]
        pending.extend(getattr(current, "commands", {}).values())
    return command


def _names_paths(param: Any) -> bool:
    """Whether a parameter takes paths by its declared type: typer before 0.29 converts to Path
    after `process_value`, so the converted value alone does not tell."""
    return getattr(getattr(param, "type", None), "name", None) == "path"


def _nonempty(param: Any, process: Callable) -> Callable:
    def process_value(ctx: Any, value: Any) -> Any:
        result = process(ctx, value)
        given = value if isinstance(value, list | tuple) else [value]
        made = result if isinstance(result, list | tuple) else [result]
        if _names_paths(param) or any(isinstance(item, PurePath) for item in made):
            if "" in given:
                raise typer.BadParameter(EMPTY_PATH, ctx=ctx, param=param)
            if "-" in given:  # stdout or stdin to most tools; a file or directory named "-" here
                raise typer.BadParameter(DASH_PATH, ctx=ctx, param=param)
            if param.name in REPORT_FILES and any(_a_folder(item) for item in given):
                raise typer.BadParameter(FOLDER_REPORT, ctx=ctx, param=param)
        return result

    return process_value


REPORT_FILES = {"json", "junit", "markdown", "html"}  # files; --plot names a directory
FOLDER_REPORT = (
    "a report is a file, and a path ending in '/' names a directory; give the file's name "
    "(out/report.json)"
)


def _a_folder(value: Any) -> bool:
    """Whether a raw path value ends in a separator: a directory's name."""
    return isinstance(value, str) and value.endswith(("/", os.sep))


def with_k(overrides: dict | None, accum_steps: int | None, nproc: int | None = None) -> dict:
    """The config overrides with -k and --nproc where given."""
    given = {"accum_steps": accum_steps, "nproc": nproc}
    return {**(overrides or {}), **{k: v for k, v in given.items() if v is not None}}


_REPORTING = {("compare",), ("verify",), ("merged",), ("golden", "check"), ("selftest",)}
_ERROR_REPORTS = ("json", "junit", "markdown")  # the reports an error is written into


def reports_in_argv(args: list[str]) -> dict[str, Path]:
    """The JSON, JUnit and Markdown report paths a command line that could not be parsed (an
    unknown option, a bad value) names, for a command that writes reports: its error is left
    there as for any other (`report.error_reports`), where a CI job reading them found nothing."""
    words = [a for a in args if not a.startswith("-")]
    if not any(tuple(words[: len(c)]) == c for c in _REPORTING):
        return {}
    found: dict[str, Path] = {}
    for i, arg in enumerate(args):
        name, _, value = arg.partition("=")
        if not value and i + 1 < len(args):
            value = args[i + 1]
        key = name[2:] if name.startswith("--") else None
        named = value and not value.startswith("-") and not value.endswith(("/", os.sep))
        if key in _ERROR_REPORTS and named and key not in found:  # `out/`: a folder's name
            found[key] = Path(value)
    return found
