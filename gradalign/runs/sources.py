"""Open a run from whatever the user points at: a run directory or a framework's log file."""

from __future__ import annotations

from pathlib import Path

from ..errors import BadInput
from .layout import is_run_dir
from .model import Run
from .paddle_log import looks_like_paddle_log, read_paddle_log
from .reader import read_run_dir


def open_run(path: Path, accum_steps: int | None, role: str) -> Run:
    """A Run from a run directory (K from its manifest) or a PaddlePaddle-style log (K given)."""
    if path.is_dir():
        run = read_run_dir(path)
        if accum_steps is not None and accum_steps != run.accum_steps:
            raise BadInput(
                f"{path}: {role} run was recorded with K={run.accum_steps}, "
                f"but --accum-steps {accum_steps} was given"
            )
        return run
    if not path.exists():
        raise BadInput(f"{path}: no such run directory or log file")
    if looks_like_paddle_log(path):
        return read_paddle_log(path, 1 if accum_steps is None else accum_steps)
    raise BadInput(f"{path}: neither a gradalign run directory nor a recognised training log")


def open_reference(option: str | None, base: Run) -> tuple[Run | None, str | None]:
    """The reference run to calibrate by, and a note when a named one is missing.

    `option` is a path, "none", or None for the one the baseline's manifest names.
    """
    if option == "none":
        return None, None
    if option is not None:
        return open_run(Path(option), None, "reference"), None
    if base.reference is None:
        return None, None
    path = Path(base.reference)
    if not is_run_dir(path):
        return None, (
            f"the baseline names a reference run at {path}, which is missing; judged by the "
            "fixed tolerances instead"
        )
    return read_run_dir(path), None
