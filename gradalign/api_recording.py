"""The recording half of the API, behind `api.record_baseline`, `record_merged`, `verify` and
`merged_against`: the checks before any work, the one look at the model, and training a run
into its place in a `RunSet`. Torch is imported only inside these functions."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .config import REFERENCES, TrainConfig
from .errors import BadInput, signals_deferred
from .feedback import Feedback
from .paths import resolved
from .runs.model import Run

PathLike = str | Path


def require_torch() -> None:
    """Training and recording need torch; judging does not. Say so in one line."""
    try:
        with signals_deferred():  # an interrupt inside the import aborts the process
            import torch  # noqa: F401
    except ImportError as exc:
        raise BadInput(
            f"training needs torch, which cannot be imported here ({exc}): pip install "
            "'gradalign[torch]' (a CPU build where there is no GPU; the README's Quick start "
            "sets one up), or judge recorded runs and logs with `compare`"
        ) from None


def check_ranks(config: TrainConfig) -> None:
    """A merged run on several ranks needs a backend this machine has (checked before work)."""
    if config.nproc > 1:
        from .record.launch import backend_for

        backend_for(config)


def check_plan(
    config: TrainConfig,
    outs: list[Path],
    *,
    reference: str = "none",
    fault: str | None = None,
    inputs: Sequence[PathLike] = (),
    reports: Sequence[PathLike] = (),
) -> None:
    """Check every input before any work: the reference choice, the fault, the outputs (writable,
    not an input, reports not inside a run), and that the run fits in memory and on disk."""
    require_torch()
    from .record.budget import check_budget
    from .record.faults import get_fault
    from .runs.outputs import check_outputs
    from .runs.writer import ensure_writable

    if reference not in REFERENCES:
        raise BadInput(f"reference must be one of {', '.join(REFERENCES)}, got {reference!r}")
    get_fault(fault, config)
    check_ranks(config)
    outs = [*outs, *reference_names(config, outs[0], reference)]
    check_outputs(outs, inputs, reports)
    for out in outs:
        ensure_writable(out)
    check_budget(config, outs)


def inspect_model(
    config: TrainConfig,
    feedback: Feedback,
    first: Callable[[dict[str, Any], list[tuple[str, tuple, str]]], None] | None = None,
) -> dict[str, Any]:
    """Build the model, data and loss once and run one micro-batch (a mistake in the user's own
    code stops here); warn about layers that make B/K compute something else than B, and say
    which numeric settings apply. `first`: a check of the environment and the model's
    parameters (name, shape, "param") that may refuse them before any of that is said. Returns
    the environment the run will record."""
    from .record.preflight import determinism_line, warnings_for
    from .record.trainer import compute_dtype
    from .record.trainer import preflight as build_once

    facts, env, params = build_once(config)
    ranks = {"world_size": config.nproc} if config.nproc > 1 else {}  # as the run will record
    env = {**env, "compute_dtype": compute_dtype(config), **ranks}
    if first is not None:
        first(env, params)
    for line in warnings_for(facts):
        feedback.message(f"warning: {line}")
    feedback.message(f"settings: {determinism_line(env)}")
    return env


def refuse_other_model(params: list[tuple[str, tuple, str]], like: Run) -> None:
    """Before training against a kept run or golden (`like`): the model the settings build
    (`params`, as `inspect_model` reads them) must hold its parameters, name for name and
    shape for shape; else they are refused in one line instead of after the training."""
    from .judge.compatible import first_difference

    recorded = [(t.name, tuple(t.shape), t.kind) for t in like.tensors if t.kind == "param"]
    if recorded != params:
        raise BadInput(
            f"the model these settings build is not the one {like.source} recorded: "
            f"{first_difference(recorded, params, 'merged run')}; leave out the settings that "
            "change the model (--model, --hidden and the like)"
        )


def reference_names(config: TrainConfig, baseline: Path, reference: str) -> list[Path]:
    """Where the baseline's float64 reference goes, if one is recorded."""
    from .record.trainer import reference_path

    wanted = reference == "fp64" and config.param_dtype != "float64"
    return [reference_path(baseline)] if wanted else []


def train_into(
    config: TrainConfig,
    where: Path,
    shown: Path,
    label: str,
    feedback: Feedback,
    fault: str | None = None,
    reference: str | None = None,
    skip_updates: Sequence[int] = (),
) -> None:
    """Record one run at `where` (a set's private area), announced as `shown`; a merged run
    of `nproc` > 1 is trained on that many ranks."""
    train_many([(config, where, shown, fault)], label, feedback, reference, skip_updates)


def train_many(
    runs: Sequence[tuple[TrainConfig, Path, Path, str | None]],
    label: str,
    feedback: Feedback,
    reference: str | None = None,
    skip_updates: Sequence[int] = (),
) -> None:
    """Record several runs (config, where, shown, fault): one process trains those of one
    rank in turn; those of W ranks share one launch per W (starting ranks costs seconds).
    `skip_updates`: steps skipped in the one-rank runs (record/skips.py)."""
    from .record.faults import get_fault
    from .record.loop import train

    for config, where, _, fault in runs:
        if config.nproc == 1:
            with _progress(feedback, label, config) as advance:
                train(
                    config,
                    where,
                    lambda _: advance(),
                    fault=get_fault(fault, config),
                    reference=reference,
                    skip_updates=skip_updates,
                )
    for nproc in sorted({config.nproc for config, *_ in runs} - {1}):
        batch = [run for run in runs if run[0].nproc == nproc]
        _launch(batch, nproc, label, feedback)
    for config, _, shown, fault in runs:
        extra = f", fault {fault}" if fault else ""
        ranks = f" on {config.nproc} ranks" if config.nproc > 1 else ""
        feedback.message(
            f"{label}: {config.updates} updates x K={config.accum_steps}{ranks}{extra} -> {shown}"
        )


def _progress(feedback: Feedback, label: str, config: TrainConfig):
    ranks = f", W={config.nproc}" if config.nproc > 1 else ""
    return feedback.progress(f"{label} (K={config.accum_steps}{ranks})", config.updates)


def _launch(
    batch: Sequence[tuple[TrainConfig, Path, Path, str | None]],
    nproc: int,
    label: str,
    feedback: Feedback,
) -> None:
    """One launch of `nproc` ranks for every run of the batch, with one progress bar each."""
    from contextlib import ExitStack

    from .record.launch import Job, launch

    jobs = [Job(config, str(where), fault) for config, where, _, fault in batch]
    with ExitStack() as stack:
        bars = [stack.enter_context(_progress(feedback, label, c)) for c, *_ in batch]
        launch(jobs, nproc, lambda job, _update: bars[job]())


def record_baseline_into(
    runs: Any, cfg: TrainConfig, out: Path, reference: str, feedback: Feedback
) -> None:
    """The baseline and (unless `reference` is none) its float64 rerun, into a RunSet. The
    rerun skips the steps the baseline's GradScaler skipped (it never overflows itself)."""
    from .api import skipped_updates
    from .record.trainer import reference_config

    refs = reference_names(cfg, out, reference)
    link = f"../{refs[0].name}" if refs else None
    train_into(cfg, runs.path(out.name), out, "baseline", feedback, reference=link)
    for ref_dir in refs:
        skips = skipped_updates(runs.path(out.name))
        rerun = reference_config(cfg)
        where = runs.path(ref_dir.name)
        train_into(rerun, where, ref_dir, "reference (fp64)", feedback, skip_updates=skips)


def record_merged_runs(
    runs: Sequence[tuple[Any, PathLike, str | None]], feedback: Feedback | None = None
) -> list[Path]:
    """Record several merged runs, each (config, out, fault), checked before any training; the
    data-parallel ones (nproc > 1) share one launch per W. All appear, or none does."""
    from contextlib import ExitStack

    from .api import as_config, as_path
    from .feedback import Silent
    from .runs.runset import RunSet

    feedback = feedback or Silent()
    plans = [(as_config(config), as_path(out, "out"), fault) for config, out, fault in runs]
    if len({resolved(out) for _, out, _ in plans}) < len(plans):
        raise BadInput("two merged runs would be recorded at the same path")
    for config, out, fault in plans:
        check_plan(config, [out], fault=fault)
    parents: dict[Path, list[str]] = {}
    for _, out, _ in plans:
        parents.setdefault(out.parent, []).append(out.name)
    with ExitStack() as stack:  # one set per directory: a set's private area is per process
        sets = {
            parent: stack.enter_context(RunSet(parent, names)) for parent, names in parents.items()
        }
        where = [sets[out.parent].path(out.name) for _, out, _ in plans]
        train_many(
            [(cfg, at, out, fault) for (cfg, out, fault), at in zip(plans, where, strict=True)],
            "merged",
            feedback,
        )
    return [out for _, out, _ in plans]
