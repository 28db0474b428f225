"""The library API: what the command line, the selftest and Python users call.

    from gradalign import api

    comparison = api.verify({"optimizer": "adam", "accum_steps": 4}, "runs/verify")
    print(comparison.verdict, [d.code for d in comparison.diagnosis])
    again = api.compare("runs/verify/baseline", "runs/verify/merged")

`record_baseline` and `record_merged` train the built-in loop (or the user's own model, data and
loss) and record a run; `compare` judges two recorded runs (or logs) from their files alone;
`verify` does all three; `golden_write` and `golden_check` (from `api_golden`) keep a baseline as a
small golden file and judge against it. Training needs torch; judging does not import it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from . import api_recording as recording
from .api_golden import GoldenCheck, golden_check, golden_write
from .api_recording import check_plan, inspect_model, record_merged_runs, require_torch
from .config import ENTRY_POINT_KEYS, TrainConfig, load_config
from .errors import BadInput, shown
from .feedback import Feedback, Silent
from .judge.results import Comparison
from .judge.strict import fail_on_warnings
from .paths import named, nonempty, resolved
from .recorded import config_from_recorded, is_code, recorded_config

PathLike = str | Path
ConfigLike = TrainConfig | Mapping[str, Any] | PathLike | None
__all__ = [
    "Feedback",
    "GoldenCheck",
    "Silent",
    "as_config",
    "compare",
    "golden_check",
    "golden_write",
    "merged_against",
    "record_baseline",
    "record_merged",
    "record_merged_runs",
    "skipped_updates",
    "verify",
]


def as_config(config: ConfigLike, overrides: Mapping[str, Any] | None = None) -> TrainConfig:
    """A TrainConfig from a TrainConfig, a mapping of config keys, or a YAML file's path."""
    if isinstance(config, TrainConfig):
        return config.replace(**dict(overrides or {})) if overrides else config
    if config is None or isinstance(config, Mapping):
        return load_config(None, {**dict(config or {}), **dict(overrides or {})})
    return load_config(as_path(config, "config"), dict(overrides or {}))


def check_tolerances(tolerances: Mapping[str, Any] | None) -> dict[str, Any]:
    """Tolerance overrides, validated before any work (unknown names, non-numbers)."""
    from .judge.tolerances import for_dtype

    if tolerances is not None and not isinstance(tolerances, Mapping):
        raise BadInput(f"tolerances must be a mapping of names to numbers, got {shown(tolerances)}")
    checked = dict(tolerances or {})
    try:
        for_dtype("float32", checked)
    except (TypeError, ValueError, OverflowError) as exc:
        raise BadInput(f"tolerances: {exc}") from None
    return checked


def as_path(value: Any, what: str) -> Path:
    """A path argument of the API (str, bytes or os.PathLike), else BadInput."""
    if isinstance(value, bytes):
        value = os.fsdecode(value)
    if not isinstance(value, str | os.PathLike):
        raise BadInput(f"{what} must be a path, got {shown(value)}")
    nonempty(value, what)
    return named(Path(value), what)


def record_baseline(
    config: ConfigLike,
    out: PathLike = "runs/baseline",
    *,
    reference: str = "fp64",
    feedback: Feedback | None = None,
    checked: bool = False,
) -> Path:
    """Train at batch B (K=1) and record the run at `out`; with reference "fp64", also record the
    same training in float64 beside it (`OUT-fp64`), the noise floor the judge uses. Both appear
    together, or neither does and an earlier pair stays as it was."""
    require_torch()
    from .runs.runset import RunSet

    cfg, out, feedback = (
        as_config(config).replace(accum_steps=1, nproc=1),
        as_path(out, "out"),
        feedback or Silent(),
    )
    if not checked:
        check_plan(cfg, [out], reference=reference)
    names = [out.name, *(p.name for p in recording.reference_names(cfg, out, reference))]
    with RunSet(out.parent, names) as runs:
        if not checked:
            inspect_model(cfg, feedback)
        recording.record_baseline_into(runs, cfg, out, reference, feedback)
    return out


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
    require_torch()
    from .runs.runset import RunSet

    cfg, out, feedback = as_config(config), as_path(out, "out"), feedback or Silent()
    if not checked:
        check_plan(cfg, [out], fault=fault)
    with RunSet(out.parent, [out.name]) as runs:
        if not checked:
            inspect_model(cfg, feedback)
        recording.train_into(cfg, runs.path(out.name), out, "merged", feedback, fault)
    return out


def compare(
    baseline: PathLike,
    merged: PathLike | Sequence[PathLike],
    *,
    reference: PathLike | None = None,
    tolerances: Mapping[str, Any] | None = None,
    accum_steps: int | None = None,
    baseline_accum_steps: int = 1,
    card_loss: str | None = None,
    reports: Sequence[PathLike] = (),
    feedback: Feedback | None = None,
    verify_files: bool = False,
    strict: bool = False,
) -> Comparison:
    """Judge `merged` against `baseline` (run directories or training logs) from their files.

    `merged`: one run directory or log, or several logs, one per card of a data-parallel run
    (card 0 first), whose losses are combined by `card_loss` ("mean", the default: each card
    printed the mean over its own samples; "sum": each card's loss was already divided by the
    global item count). `reference`: a float64 rerun of the baseline to calibrate by; by default
    the one the baseline's manifest names; "none" for the fixed tolerances. `accum_steps`: K of
    a merged log (a run directory states its own). `reports`: files the caller will write
    afterwards, checked first. `verify_files`: first check every file of every run directory
    against the checksum its manifest lists (the judge itself checks each tensor's fingerprint as
    it reads it, docs/FORMAT.md). `strict`: a comparison whose report warns that a check could
    not fail or could not see what it names fails (`judge/strict.py`, code `warned`). Raises
    BadInput for unreadable or incomparable runs.
    """
    from .judge.compare import compare as judge
    from .runs.outputs import check_outputs
    from .runs.sources import (
        check_log_counters,
        check_log_updates,
        check_smoothing,
        open_merged,
        open_reference,
        open_run,
    )

    checked = check_tolerances(tolerances)
    baseline = as_path(baseline, "baseline")
    if isinstance(merged, str | bytes | os.PathLike):
        sources = [as_path(merged, "merged")]
    elif isinstance(merged, Sequence) and merged:
        sources = [as_path(m, "merged") for m in merged]
    else:
        raise BadInput(f"merged must be a path or a list of card logs, got {shown(merged)}")
    if reference is not None and reference != "none":
        reference = as_path(reference, "reference")
    _check_k(accum_steps, "accum_steps (K of the merged run, --accum-steps)")
    _check_k(baseline_accum_steps, "baseline_accum_steps (--baseline-accum-steps)")
    if not sources:
        raise BadInput("no merged run given")
    named = [] if reference in (None, "none") else [Path(reference)]
    check_outputs([], [Path(baseline), *sources, *named], reports)
    for source in sources:
        if resolved(baseline) == resolved(source):
            raise BadInput(
                f"{baseline} is compared with itself: that proves nothing; give two runs"
            )
    base_run = open_run(Path(baseline), baseline_accum_steps, role="baseline")
    merged_run = open_merged(sources, accum_steps, card_loss)
    base_run, merged_run = check_smoothing(base_run, merged_run)
    check_log_updates(base_run, merged_run)
    check_log_counters(base_run, merged_run)
    if accum_steps is None:
        _hint_k(base_run.updates, merged_run.micro_steps, merged_run.kind, merged_run.source)
    ref_run, note = open_reference(None if reference is None else str(reference), base_run)
    if ref_run is not None:
        check_outputs([], [ref_run.source], reports)
    if verify_files:
        from .runs.store import verify_files as verify

        for run in (base_run, merged_run, ref_run):
            if run is not None and run.store is not None:
                verify(run.store)
    with (feedback or Silent()).progress("compare", base_run.updates) as advance:
        comparison = judge(base_run, merged_run, checked, ref_run, on_update=lambda _: advance())
    if note:
        comparison.notes.append(note)
    return fail_on_warnings(comparison) if strict else comparison


def skipped_updates(run: PathLike) -> list[int]:
    """The updates at which the recorded `run` did not step its optimizer: a GradScaler skips
    the step where the scaled gradients overflow. A float64 reference of that run must skip the
    same ones: `gradalign.Recorder(..., skip_updates=gradalign.skipped_updates(BASE))`."""
    from .runs.reader import read_run_dir

    steps = read_run_dir(as_path(run, "run")).optimizer_steps
    return [] if steps is None else [int(u) for u in (steps == 0).nonzero()[0]]


def _check_k(value: Any, what: str) -> None:
    """A K given for a run: an integer >= 1, checked before it is compared with any run's."""
    from .runs.schema import MAX_MICRO_STEPS

    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadInput(f"{what} must be an integer, got {shown(value)}")
    if not 1 <= value <= MAX_MICRO_STEPS:
        raise BadInput(
            f"{what} must be an integer from 1 to {MAX_MICRO_STEPS} (K micro-steps make one "
            f"update), got {shown(value)}"
        )


def _hint_k(base_updates: int, micro_steps: int, kind: str, source: str) -> None:
    """A log does not say its K: when -k was left out and the lengths say it, say so."""
    k, rest = divmod(micro_steps, base_updates) if base_updates else (0, 1)
    if kind == "log" and not rest and k > 1:
        raise BadInput(
            f"{source}: {micro_steps} micro-steps against {base_updates} baseline updates; a "
            f"log does not say its K: give --accum-steps {k}"
        )


def verify(
    config: ConfigLike = None,
    out: PathLike = "runs/verify",
    *,
    fault: str | None = None,
    reference: str = "fp64",
    tolerances: Mapping[str, Any] | None = None,
    reports: Sequence[PathLike] = (),
    feedback: Feedback | None = None,
    strict: bool = False,
) -> Comparison:
    """Record the baseline (and its float64 reference) and the merged run under `out`, then
    judge them: `out/baseline`, `out/baseline-fp64`, `out/merged`. The three appear together, or
    none does and an earlier set stays as it was. `strict`: as `compare`'s."""
    require_torch()
    from .runs.runset import RunSet

    cfg, out, feedback = as_config(config), as_path(out, "out"), feedback or Silent()
    in_file = _file_tolerances(config) if isinstance(config, str | os.PathLike) else {}
    checked = check_tolerances({**in_file, **dict(tolerances or {})})  # a YAML's, as the CLI's
    base, merged = out / "baseline", out / "merged"
    check_plan(cfg, [base, merged], reference=reference, fault=fault, reports=reports)
    names = [
        "baseline",
        *(p.name for p in recording.reference_names(cfg, base, reference)),
        "merged",
    ]
    with RunSet(out, names) as runs:
        inspect_model(cfg, feedback)
        recording.record_baseline_into(
            runs, cfg.replace(accum_steps=1, nproc=1), base, reference, feedback
        )
        recording.train_into(cfg, runs.path("merged"), merged, "merged", feedback, fault)
    return compare(
        base, merged, tolerances=checked, reports=reports, feedback=feedback, strict=strict
    )


def merged_against(
    baseline: PathLike,
    out: PathLike = "runs/merged",
    *,
    overrides: Mapping[str, Any] | None = None,
    config_file: PathLike | None = None,
    fault: str | None = None,
    tolerances: Mapping[str, Any] | None = None,
    trust_run_code: bool = False,
    reports: Sequence[PathLike] = (),
    feedback: Feedback | None = None,
    strict: bool = False,
) -> Comparison:
    """The merged half alone, against a kept baseline run or a golden file (or a directory of
    them): train the experiment it recorded (with `overrides`, and K from them or the default),
    then judge; `strict`: as `compare`'s.

    The baseline's own model, data or loss code (`module:factory` in its manifest) is imported
    only when `overrides` name the same code or `trust_run_code` is set: a shared run must not
    run code it carries. Everything is checked before training: the baseline is readable and
    K=1, `out` is not the baseline or its reference, the reports land outside every run."""
    from . import api_against as against
    from . import api_golden as goldens
    from .runs.reader import read_run_dir
    from .runs.runset import RunSet

    feedback = feedback or Silent()
    checked = check_tolerances({**_file_tolerances(config_file), **dict(tolerances or {})})
    out, golden = as_path(out, "out"), goldens.is_golden(baseline)
    if golden:
        recorded = goldens.golden_config(baseline)
        cfg = config_from_recorded(recorded, baseline, overrides, config_file, trust_run_code)
        inputs = [Path(baseline)]
    else:
        base_run = read_run_dir(Path(baseline))
        if base_run.accum_steps != 1:
            raise BadInput(
                f"{baseline} was recorded with K={base_run.accum_steps}; --against needs a K=1 "
                "baseline run"
            )
        cfg = recorded_config(baseline, overrides, config_file, trust_run_code)
        inputs = [Path(baseline), *([Path(base_run.reference)] if base_run.reference else [])]
    recorded_updates = recorded.get("updates") if golden else base_run.updates
    if cfg.updates != recorded_updates:  # compare would refuse it after the training
        raise BadInput(
            f"--updates {cfg.updates}: {baseline} holds {recorded_updates} updates, and a merged "
            "run is judged update by update against them; leave --updates out"
        )
    check_plan(cfg, [out], fault=fault, inputs=inputs, reports=reports)

    def refuse_others(env: dict[str, Any], params: list[tuple[str, tuple, str]]) -> None:
        """Another environment (a golden's) or another model, refused before any training."""
        if not golden:
            recording.refuse_other_model(params, base_run)
            return
        golden_file = against.refuse_other_environment(baseline, env, out, reports)
        recording.refuse_other_model(params, against.golden_run(golden_file))

    with RunSet(out.parent, [out.name]) as runs:
        inspect_model(cfg, feedback, first=refuse_others)
        recording.train_into(cfg, runs.path(out.name), out, "merged", feedback, fault)
    if golden:
        comparison = against.judge_against(baseline, out, checked, reports, feedback)
    else:
        comparison = compare(baseline, out, tolerances=checked, reports=reports, feedback=feedback)
    if trust_run_code:
        code = {k: cfg.to_dict()[k] for k in ENTRY_POINT_KEYS if is_code(cfg.to_dict()[k])}
        if code:
            comparison.notes.append(
                "--trust-run-code: imported the code the baseline's manifest names: "
                + ", ".join(f"{k}={v}" for k, v in code.items())
            )
    return fail_on_warnings(comparison) if strict else comparison


def _file_tolerances(config_file: PathLike | None) -> dict[str, Any]:
    from .config import tolerances_from_yaml

    return tolerances_from_yaml(None if config_file is None else Path(config_file))
