"""Bookkeeping per update: the learning rate, optimizer steps, the optimizer's own step counter
and the loss scale must be identical in both runs. Scalars are compared at the precision they
were recorded in: an lr kept in float32 by one framework and written as a Python float by
another is the same lr if one is the float32 rounding of the other."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from ..runs.model import Run
from .results import UpdateResult

NARROW = {"float32": np.float32, "float16": np.float16}


def recorded_dtype(series: np.ndarray) -> str:
    """The precision a series was recorded in: its stored dtype if narrower than float64, else
    float32 when every finite value is exactly a float32 (a float32 widened when written)."""
    if series.dtype in (np.float32, np.float16):
        return series.dtype.name
    finite = np.asarray(series, dtype=np.float64)
    finite = finite[np.isfinite(finite)]
    widened = finite.size and np.array_equal(finite.astype(np.float32).astype(np.float64), finite)
    return "float32" if widened else "float64"


def same_scalar(a: float, b: float, dtype_a: str = "float64", dtype_b: str = "float64") -> bool:
    """Equal at the coarser of the two recorded precisions (NaN equals NaN: no step in either)."""
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    coarse = [NARROW[d] for d in (dtype_a, dtype_b) if d in NARROW]
    if coarse:
        narrow = min(coarse, key=lambda t: np.finfo(t).bits)
        with np.errstate(over="ignore"):
            return bool(narrow(a) == narrow(b))
    return math.isclose(a, b, rel_tol=1e-12)


def distinct(a: float, b: float) -> tuple[str, str]:
    """`a` and `b` printed with as few significant digits as show them apart (6 at least)."""
    for digits in range(6, 18):
        shown = f"{a:.{digits}g}", f"{b:.{digits}g}"
        if shown[0] != shown[1]:
            return shown
    return f"{a:.17g}", f"{b:.17g}"


def lr_groups(base: Run, merged: Run) -> list[tuple[int, np.ndarray, np.ndarray]]:
    """The learning rates both runs recorded, as (group, baseline's, merged's): every param
    group's where both recorded as many groups (`update/lr_groups`, in the model's order), else
    the first group's alone; none where a run recorded no lr."""
    if base.lr is None or merged.lr is None:
        return []
    gb, gm = base.lr_groups, merged.lr_groups
    if gb is not None and gm is not None and gb.shape[1] == gm.shape[1]:
        return [(g, gb[:, g], gm[:, g]) for g in range(gb.shape[1])]
    return [(0, np.asarray(base.lr), np.asarray(merged.lr))]


def group_named(group: int) -> str:
    """How a message names a param group's lr: the first group's plainly."""
    return f" (param group {group})" if group else ""


def bookkeeping_judge(base: Run, merged: Run) -> Callable[[UpdateResult], None]:
    """A function that adds a problem to an update's result for every bookkeeping series that
    differs at that update (the series' recorded precisions are found once)."""
    lrs = [(g, b, m, (recorded_dtype(m), recorded_dtype(b))) for g, b, m in lr_groups(base, merged)]
    return lambda result: _judge(result, base, merged, lrs)


def _judge(result: UpdateResult, base: Run, merged: Run, lrs: list) -> None:
    i = result.update
    stepped = all(r.optimizer_steps is None or r.optimizer_steps[i] > 0 for r in (base, merged))
    for group, base_lr, merged_lr, dtypes in lrs if stepped else ():
        # a run that did not step recorded no lr: its step count differs, said below
        lb, lm = float(base_lr[i]), float(merged_lr[i])
        printed = sum(float(r.lr_quantum[i]) for r in (base, merged) if r.lr_quantum is not None)
        if not same_scalar(lm, lb, *dtypes) and not abs(lm - lb) <= printed:
            shown_m, shown_b = distinct(lm, lb)
            text = f"lr {shown_m} in merged, {shown_b} in baseline{group_named(group)}"
            result.problems.append(("lr", text))
            break  # one group says it: the signatures read the first that differs
    if base.optimizer_steps is not None and merged.optimizer_steps is not None:
        sb, sm = int(base.optimizer_steps[i]), int(merged.optimizer_steps[i])
        if sb != sm:
            result.problems.append(
                ("optimizer_steps", f"{sm} optimizer step(s) in merged, {sb} in baseline")
            )
    if base.loss_scale is not None and merged.loss_scale is not None:
        cb, cm = float(base.loss_scale[i]), float(merged.loss_scale[i])
        if cb != cm:
            result.problems.append(
                ("loss_scale", f"loss scale {cm:g} in merged, {cb:g} in baseline")
            )
    if base.clip_max_norm is not None and merged.clip_max_norm is not None:
        cb, cm = float(base.clip_max_norm[i]), float(merged.clip_max_norm[i])
        if math.isfinite(cb) and math.isfinite(cm) and not same_scalar(cm, cb):
            result.problems.append(
                (
                    "clip_max_norm",
                    f"clip_grad_norm_ at max_norm {cm:g} in merged, {cb:g} in baseline",
                )
            )
    if base.state_step is not None and merged.state_step is not None:
        sb, sm = int(base.state_step[i]), int(merged.state_step[i])
        if sb != sm:
            result.problems.append(
                ("state_step", f"optimizer's own step count {sm} in merged, {sb} in baseline")
            )


def unjudged_losses(base: Run, merged: Run, n: int) -> np.ndarray:
    """bool [n]: the updates whose loss is not judged: a run did not give it (a log prints none
    for an iteration its loss scaler skipped) and neither run stepped its optimizer there, so
    both skipped it alike; or both runs' losses are not finite there alike (`bad_alike`). A
    loss missing where a run stepped is judged, and fails."""
    alike = bad_alike(base, merged, n)
    shared = np.zeros(n, dtype=bool) if alike is None else alike
    missing = ~(base.window_loss_known()[:n] & merged.window_loss_known()[:n])
    for run in (base, merged):
        steps = run.optimizer_steps
        if steps is None:
            return shared
        missing &= np.asarray(steps[:n]) == 0
    return missing | shared


def _not_finite(run: Run, n: int) -> np.ndarray:
    """bool [n]: the updates whose window loss is known and not finite."""
    with np.errstate(invalid="ignore", over="ignore"):
        losses = run.window_losses()[:n]
    return ~np.isfinite(losses) & run.window_loss_known()[:n]


def bad_alike(base: Run, merged: Run, n: int) -> np.ndarray | None:
    """bool [n]: the updates whose loss is not finite in both runs, where every update whose
    loss is not finite in either run is one, and both runs are finite again after the last (a
    bad batch both runs met, its step skipped by both); None where the runs are not so (one
    alone, or one that never recovers: a divergence) or every loss is finite."""
    b, m = _not_finite(base, n), _not_finite(merged, n)
    if not b.any() or not np.array_equal(b, m):
        return None
    last = int(np.flatnonzero(b)[-1])
    after = [np.isfinite(run.window_losses()[last + 1 :]) for run in (base, merged)]
    return b if all(a.size and a.any() for a in after) else None
