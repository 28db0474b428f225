"""A reference is the baseline's own training rerun: it steps where the baseline stepped, with an
optimizer of the same kind, settings and learning rates, and its losses are finite where the
baseline's are (`compatible.check_reference` calls these before judging)."""

from __future__ import annotations

import math

import numpy as np

from ..errors import BadInput
from ..runs.model import Run
from .distributed import listed
from .settings_apart import other_kind, settings_apart


def check_same_optimizer(base: Run, ref: Run, where: str) -> None:
    """Refuse a reference whose optimizer is of another kind, was given other settings or
    stepped at other learning rates than the baseline's: the first gradient, from the same
    weights, agrees whatever steps with it, while the weights' noise floor it gives would
    stand as far apart as the two optimizers take them (a weight check that cannot fail)."""
    sb, sr = base.optimizer_settings, ref.optimizer_settings
    if sb and sr and other_kind(sb, sr):
        raise BadInput(
            f"{where} is another training: its optimizer is {sr.get('type')}, the baseline's "
            f"{sb.get('type')}"
        )
    differ = settings_apart(sb, sr, [t.name for t in base.tensors]) if sb and sr else {}
    if differ:
        (key, vb, vr), tensors = next(iter(differ.items()))
        raise BadInput(
            f"{where} is another training: its optimizer's {key} is {vr}, the baseline's {vb} "
            f"({listed(tensors, 3)})"
        )
    lb, lr = base.lr, ref.lr
    if lb is None or lr is None:
        return
    n = min(len(lb), len(lr))
    apart = np.flatnonzero(~np.isclose(lb[:n], lr[:n], rtol=1e-6, atol=0.0, equal_nan=True))
    if apart.size:
        u = int(apart[0])
        raise BadInput(
            f"{where} is another training: its learning rate at update {u} is {lr[u]:.6g}, the "
            f"baseline's {lb[u]:.6g}"
        )


def not_finite(where: str, what: str) -> BadInput:
    return BadInput(
        f"{where} is not finite where the baseline is: {what}; a rerun that overflows or "
        "divides by zero where the baseline does not gives no noise floor (look for a mask or "
        "constant filled with its dtype's extreme value), so rerun it, or judge with "
        "--reference none"
    )


def check_finite_losses(base: Run, ref: Run, where: str) -> None:
    """Refuse a reference whose window losses are not finite where the baseline's are."""
    lb, lr = base.window_losses(), ref.window_losses()
    n = min(len(lb), len(lr))
    bad = np.flatnonzero(np.isfinite(lb[:n]) & ~np.isfinite(lr[:n]))
    if bad.size:
        u = int(bad[0])
        raise not_finite(
            where,
            f"its loss at update {u} is {lr[u]:g} against the baseline's {lb[u]:.6g} "
            f"({bad.size} of {n} updates)",
        )


def check_same_steps(base: Run, ref: Run, where: str) -> None:
    """Refuse a reference that stepped its optimizer where the baseline did not, or the other
    way. A GradScaler skips the step of a window whose scaled gradients overflow (commonly the
    first updates, while its scale comes down); a float64 rerun never overflows, so it must be
    told which updates to skip (`Recorder(..., skip_updates=...)`, record/skips.py)."""
    sb, sr = base.optimizer_steps, ref.optimizer_steps
    if sb is None or sr is None:
        return
    n = min(len(sb), len(sr))
    apart = np.flatnonzero(sb[:n] != sr[:n])
    if not apart.size:
        return
    u = int(apart[0])
    if sb[u] == 0:
        scale = base.loss_scale[u] if base.loss_scale is not None else math.nan
        at = f" at loss scale {scale:g}" if math.isfinite(scale) else ""
        skipped = listed([str(int(i)) for i in np.flatnonzero(sb[:n] == 0)], 6)
        raise BadInput(
            f"{where} stepped at update {u}, where the baseline skipped its optimizer step (a "
            f"GradScaler skips a window whose scaled gradients overflow{at}; the baseline "
            f"skipped updates {skipped}): a float64 rerun never overflows, so it must skip them "
            "too: record it with gradalign.Recorder(..., skip_updates=gradalign.skipped_updates"
            "(BASELINE)), or judge with --reference none"
        )
    raise BadInput(
        f"{where} made {int(sr[u])} optimizer step(s) at update {u}, the baseline {int(sb[u])}: a "
        "reference must step where the baseline stepped"
    )
