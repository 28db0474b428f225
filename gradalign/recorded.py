"""The experiment a recorded baseline ran, read back to train it again at another K
(`merged --against`): only a run of the built-in trainer holds one, and code it names is
imported only when confirmed."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .config import ENTRY_POINT_KEYS, TrainConfig, load_config
from .errors import BadInput

PathLike = str | Path


def is_code(value: object) -> bool:
    """Whether a config value names the user's own code (`module:attribute`)."""
    return isinstance(value, str) and ":" in value


def recorded_config(
    baseline: PathLike,
    overrides: Mapping[str, Any] | None = None,
    config_file: PathLike | None = None,
    trust_run_code: bool = False,
) -> TrainConfig:
    """The experiment a recorded baseline ran (B, N, seed, optimizer...) over `config_file`, with
    `overrides` on top; its K of 1 is not taken over (the merged K comes from the overrides, the
    file or the default). Code it names is refused unless confirmed (see `merged_against`)."""
    from .runs.reader import read_manifest

    recorded = read_manifest(Path(baseline)).get("config", {})
    if not isinstance(recorded, dict):
        raise BadInput(f"{baseline}: manifest field 'config' is not a mapping")
    return config_from_recorded(recorded, baseline, overrides, config_file, trust_run_code)


_RETRAINED = ("model", "batch_size", "updates")  # what a built-in run's config always holds


def config_from_recorded(
    recorded: Mapping[str, Any],
    where: PathLike,
    overrides: Mapping[str, Any] | None = None,
    config_file: PathLike | None = None,
    trust_run_code: bool = False,
) -> TrainConfig:
    """A recorded config (a run's manifest, a golden file) under `overrides`, over `config_file`;
    K is not taken over, and code the record names is refused unless confirmed."""
    from .config import FIELDS

    missing = [k for k in _RETRAINED if k not in recorded]
    if missing:  # a run of the Recorder, a framework or the numpy writer: no trainer to rerun
        raise BadInput(
            f"{where} was not recorded by gradalign's built-in trainer (its config holds no "
            f"{missing[0]}): --against retrains a built-in run at another K; record the merged "
            "run with your own loop and judge it with `gradalign compare` (or `golden check`)"
        )
    kept = {k: v for k, v in recorded.items() if k in FIELDS and k != "accum_steps"}
    overrides = dict(overrides or {})
    for key in ENTRY_POINT_KEYS:
        named = kept.get(key)
        if is_code(named) and overrides.get(key) != named and not trust_run_code:
            raise BadInput(
                f"{where} was recorded with your own {key} {named!r}; gradalign does not "
                f"import code a run names: pass --{key} {named} to confirm it, or "
                "--trust-run-code"
            )
    source = Path(where) / "manifest.json" if Path(where).is_dir() else Path(where)
    path = None if config_file is None else Path(config_file)
    return load_config(path, overrides, recorded=(f"{source}: recorded config", kept))
