"""The recording half of the API, behind `api.record_baseline`, `record_merged`, `verify` and
`merged_against`: the checks before any work, the one look at the model, and training a run
into its place in a `RunSet`. Torch is imported only inside these functions."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .config import REFERENCES, TrainConfig
from .errors import BadInput
from .feedback import Feedback

PathLike = str | Path


def require_torch() -> None:
    """Training and recording need torch; judging does not. Say so in one line."""
    try:
        import torch  # noqa: F401
    except ImportError as exc:
        raise BadInput(
            f"training needs torch, which cannot be imported here ({exc}): pip install "
            "'gradalign[torch]' (a CPU build where there is no GPU; the README's Quick start "
            "sets one up), or judge recorded runs and logs with `compare`"
        ) from None


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
    outs = [*outs, *reference_names(config, outs[0], reference)]
    check_outputs(outs, inputs, reports)
    for out in outs:
        ensure_writable(out)
    check_budget(config, outs)


def inspect_model(config: TrainConfig, feedback: Feedback) -> dict[str, Any]:
    """Build the model, data and loss once and run one micro-batch (a mistake in the user's own
    code stops here); warn about layers that make B/K compute something else than B, and say
    which numeric settings apply. Returns the environment the run will record."""
    from .record.preflight import determinism_line, warnings_for
    from .record.trainer import compute_dtype
    from .record.trainer import preflight as build_once

    facts, env = build_once(config)
    for line in warnings_for(facts):
        feedback.message(f"warning: {line}")
    feedback.message(f"settings: {determinism_line(env)}")
    return {**env, "compute_dtype": compute_dtype(config)}


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
) -> None:
    """Record one run at `where` (a set's private area), announced as `shown`."""
    from .record.faults import get_fault
    from .record.loop import train

    injected = get_fault(fault, config)
    with feedback.progress(f"{label} (K={config.accum_steps})", config.updates) as advance:
        train(config, where, progress=lambda _: advance(), fault=injected, reference=reference)
    extra = f", fault {fault}" if fault else ""
    feedback.message(
        f"{label}: {config.updates} updates x K={config.accum_steps}{extra} -> {shown}"
    )


def record_baseline_into(
    runs: Any, cfg: TrainConfig, out: Path, reference: str, feedback: Feedback
) -> None:
    """The baseline and (unless `reference` is none) its float64 rerun, into a RunSet."""
    from .record.trainer import reference_config

    link = None
    for ref_dir in reference_names(cfg, out, reference):
        train_into(
            reference_config(cfg), runs.path(ref_dir.name), ref_dir, "reference (fp64)", feedback
        )
        link = f"../{ref_dir.name}"
    train_into(cfg, runs.path(out.name), out, "baseline", feedback, reference=link)
