"""The library API: what the command line, the selftest and Python users call.

    from gradalign import api

    comparison = api.verify({"optimizer": "adam", "accum_steps": 4}, "runs/verify")
    print(comparison.verdict, [d.code for d in comparison.diagnosis])
    again = api.compare("runs/verify/baseline", "runs/verify/merged")

`record_baseline` and `record_merged` train the built-in loop (or the user's own model, data and
loss) and record a run; `compare` judges two recorded runs (or logs) from their files alone;
`verify` does all three. Training needs torch; `compare` does not import it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

from .config import TrainConfig, load_config
from .errors import BadInput
from .judge.results import Comparison

PathLike = str | os.PathLike[str]
ConfigLike = TrainConfig | Mapping[str, Any] | PathLike | None
REFERENCES = ("fp64", "none")


class Feedback(Protocol):
    """Where a long command tells people what it is doing (the CLI draws it; default: silence)."""

    def message(self, text: str) -> None: ...

    def progress(self, label: str, total: int) -> Any:
        """A context manager giving a callable to call once per finished step."""


class Silent:
    """Feedback that says nothing."""

    def message(self, text: str) -> None:
        pass

    @contextmanager
    def progress(self, label: str, total: int) -> Iterator[Callable[[], None]]:
        yield lambda: None


def as_config(config: ConfigLike, overrides: Mapping[str, Any] | None = None) -> TrainConfig:
    """A TrainConfig from a TrainConfig, a mapping of config keys, or a YAML file's path."""
    if isinstance(config, TrainConfig):
        return config.replace(**dict(overrides or {})) if overrides else config
    if config is None or isinstance(config, Mapping):
        return load_config(None, {**dict(config or {}), **dict(overrides or {})})
    return load_config(Path(config), dict(overrides or {}))


def check_tolerances(tolerances: Mapping[str, Any] | None) -> dict[str, Any]:
    """Tolerance overrides, validated before any work (unknown names, non-numbers)."""
    from .judge.tolerances import for_dtype

    checked = dict(tolerances or {})
    for_dtype("float32", checked)
    return checked


def require_torch() -> None:
    """Training and recording need torch; judging does not. Say so in one line."""
    try:
        import torch  # noqa: F401
    except ImportError as exc:
        raise BadInput(
            f"training needs torch, which cannot be imported here ({exc}); install it (the "
            "README's Quick start sets up a CPU build), or judge recorded runs with `compare`"
        ) from None


def preflight(
    config: TrainConfig,
    outs: list[Path],
    *,
    reference: str = "none",
    fault: str | None = None,
    feedback: Feedback | None = None,
) -> None:
    """Check every input before any training: the reference choice, the fault, the outputs; build
    the model, data and loss once on one micro-batch; then warn about layers that make B/K
    compute something else than B, and say which numeric settings apply."""
    require_torch()
    from .record.faults import get_fault
    from .record.preflight import determinism_line, warnings_for
    from .record.trainer import preflight as build_once
    from .record.trainer import reference_path
    from .runs.writer import ensure_writable

    feedback = feedback or Silent()
    if reference not in REFERENCES:
        raise BadInput(f"reference must be one of {', '.join(REFERENCES)}, got {reference!r}")
    get_fault(fault, config)
    if reference == "fp64":
        outs = [*outs, reference_path(outs[0])]
    for out in outs:
        ensure_writable(out)
    facts, env = build_once(config)
    for line in warnings_for(facts):
        feedback.message(f"warning: {line}")
    feedback.message(f"settings: {determinism_line(env)}")


def _train(
    config: TrainConfig,
    out: Path,
    label: str,
    feedback: Feedback,
    fault: str | None = None,
    reference: str | None = None,
) -> Path:
    require_torch()
    from .record.faults import get_fault
    from .record.loop import train

    injected = get_fault(fault, config)
    with feedback.progress(f"{label} (K={config.accum_steps})", config.updates) as advance:
        path = train(config, out, progress=lambda _: advance(), fault=injected, reference=reference)
    extra = f", fault {fault}" if fault else ""
    feedback.message(f"{label}: {config.updates} updates x K={config.accum_steps}{extra} -> {path}")
    return path


def record_baseline(
    config: ConfigLike,
    out: PathLike = "runs/baseline",
    *,
    reference: str = "fp64",
    feedback: Feedback | None = None,
    checked: bool = False,
) -> Path:
    """Train at batch B (K=1) and record the run at `out`; with reference "fp64", first record
    the same training in float64 beside it (`OUT-fp64`), the noise floor the judge uses."""
    require_torch()
    from .record.trainer import reference_config, reference_path

    cfg, out, feedback = as_config(config).replace(accum_steps=1), Path(out), feedback or Silent()
    if not checked:
        preflight(cfg, [out], reference=reference, feedback=feedback)
    link = None
    if reference == "fp64" and cfg.param_dtype != "float64":
        ref_dir = reference_path(out)
        _train(reference_config(cfg), ref_dir, "reference (fp64)", feedback)
        link = f"../{ref_dir.name}"
    return _train(cfg, out, "baseline", feedback, reference=link)


def record_merged(
    config: ConfigLike,
    out: PathLike = "runs/merged",
    *,
    fault: str | None = None,
    feedback: Feedback | None = None,
    checked: bool = False,
) -> Path:
    """Train at micro-batch B/K for N·K micro-steps, stepping every K, and record the run;
    `fault` injects one named accumulation bug (see `gradalign.record.faults.FAULTS`)."""
    cfg, out, feedback = as_config(config), Path(out), feedback or Silent()
    if not checked:
        preflight(cfg, [out], fault=fault, feedback=feedback)
    return _train(cfg, out, "merged", feedback, fault)


def compare(
    baseline: PathLike,
    merged: PathLike,
    *,
    reference: PathLike | None = None,
    tolerances: Mapping[str, Any] | None = None,
    accum_steps: int | None = None,
    baseline_accum_steps: int = 1,
) -> Comparison:
    """Judge `merged` against `baseline` (run directories or training logs) from their files.

    `reference`: a float64 rerun of the baseline to calibrate by; by default the one the
    baseline's manifest names; "none" for the fixed tolerances. `accum_steps`: K of a merged log
    (a run directory states its own). Raises BadInput for unreadable or incomparable runs.
    """
    from .judge.compare import compare as judge
    from .runs.sources import open_reference, open_run

    checked = check_tolerances(tolerances)
    base_run = open_run(Path(baseline), baseline_accum_steps, role="baseline")
    merged_run = open_run(Path(merged), accum_steps, role="merged")
    ref_run, note = open_reference(None if reference is None else str(reference), base_run)
    comparison = judge(base_run, merged_run, checked, ref_run)
    if note:
        comparison.notes.append(note)
    return comparison


def verify(
    config: ConfigLike = None,
    out: PathLike = "runs/verify",
    *,
    fault: str | None = None,
    reference: str = "fp64",
    tolerances: Mapping[str, Any] | None = None,
    feedback: Feedback | None = None,
) -> Comparison:
    """Record the baseline (and its float64 reference) and the merged run under `out`, then
    judge them: `out/baseline`, `out/baseline-fp64`, `out/merged`."""
    cfg, out, feedback = as_config(config), Path(out), feedback or Silent()
    checked = check_tolerances(tolerances)
    preflight(
        cfg,
        [out / "baseline", out / "merged"],
        reference=reference,
        fault=fault,
        feedback=feedback,
    )
    base = record_baseline(
        cfg, out / "baseline", reference=reference, feedback=feedback, checked=True
    )
    merged = record_merged(cfg, out / "merged", fault=fault, feedback=feedback, checked=True)
    return compare(base, merged, tolerances=checked)


def recorded_config(
    baseline: PathLike,
    overrides: Mapping[str, Any] | None = None,
    config_file: PathLike | None = None,
) -> TrainConfig:
    """The experiment a recorded baseline ran (B, N, seed, optimizer...) over `config_file`, with
    `overrides` on top; its K of 1 is not taken over (the merged K comes from the overrides, the
    file or the default)."""
    from .config import FIELDS
    from .runs.reader import read_manifest

    recorded = read_manifest(Path(baseline)).get("config", {})
    if not isinstance(recorded, dict):
        raise BadInput(f"{baseline}: manifest field 'config' is not a mapping")
    kept = {k: v for k, v in recorded.items() if k in FIELDS and k != "accum_steps"}
    return load_config(
        None if config_file is None else Path(config_file), {**kept, **dict(overrides or {})}
    )
