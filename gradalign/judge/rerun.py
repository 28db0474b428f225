"""A reference is the baseline's own training rerun: it steps where the baseline stepped, with an
optimizer of the same kind, settings and learning rates, and its losses are finite where the
baseline's are (`compatible.check_reference` calls these before judging)."""

from __future__ import annotations

import math

import numpy as np

from ..errors import BadInput
from ..runs.model import COMPUTE_ORDER, Run, step_dtype
from .distributed import listed
from .settings_apart import other_kind, settings_apart
from .tolerances import least_precise


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


def check_more_precise(base: Run, merged: Run, ref: Run, where: str) -> None:
    """A reference computes its steps in full precision (not an optimizer that steps in 16 bits
    whatever the weights' dtype: Muon) and is more precise than the runs: it stores its weights
    more precisely (a float64 rerun of float32 runs), or as precisely and computes strictly more
    precisely, in IEEE float32: for runs under 16-bit autocast or TF32, a float32 rerun without
    them (its own rounding, 2^-24 of each value, stands far below the 2^-8 of bfloat16 the
    baseline's distance from it measures)."""
    for run in (base, ref):  # the optimizer named is the one that steps in 16 bits
        if (stepped := step_dtype(run.optimizer_settings)) is not None:  # in a float64 rerun too
            kind = run.optimizer_settings["type"]  # type: ignore[index]
            raise BadInput(
                f"{where} cannot be more precise than the baseline: its optimizer, {kind}, "
                f"computes each step in {stepped} whatever the weights' dtype, in a float64 "
                f"rerun too; judge with --reference none ({stepped}'s fixed tolerances)"
            )
    stored = least_precise([base.dtype, merged.dtype])
    compute = least_precise([base.compute_dtype, merged.compute_dtype])
    full = _rank("float32")  # float64 and float32: IEEE, no tensor cores
    if _rank(ref.dtype) < _rank(stored):
        return  # a float64 rerun of float32 runs (whatever compute dtype it copied from them)
    if _rank(ref.dtype) == _rank(stored) and _rank(ref.compute_dtype) < min(
        _rank(compute), full + 1
    ):
        return  # float32 without autocast, of float32 runs under it
    reduced = _rank(compute) > full
    rerun = "a float64 rerun" + (", or one in float32 without autocast or TF32" * reduced)
    if _rank(stored) == _rank("float64") and not reduced:
        rerun = "nothing is more precise than float64 runs: judge with --reference none"
    runs = stored if compute == stored else f"{stored}, computing in {compute}"
    own = (
        ref.dtype
        if ref.compute_dtype == ref.dtype
        else f"{ref.dtype} computing in {ref.compute_dtype}"
    )
    raise BadInput(
        f"{where} is {own}: a reference must be more precise than the runs ({runs}): {rerun}"
    )


def _rank(dtype: str) -> int:
    """A dtype's place in COMPUTE_ORDER, most precise first (one it does not know: last)."""
    return COMPUTE_ORDER.index(dtype) if dtype in COMPUTE_ORDER else len(COMPUTE_ORDER)
