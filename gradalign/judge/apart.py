"""Without a reference: gradients at updates the two runs enter with different weights.

At update 0 both runs evaluate their gradients at the same weights over the same samples, so
in any dtype they differ only by the order of the sums. From the first update whose weights
came out of the previous one differently, each run evaluates its gradient at its own weights.
In a 16-bit compute dtype that rounds every activation otherwise (and flips the ReLUs and
max-pools that sit within a rounding), so two correct runs' gradients differ by far more than
at update 0: measured on `bench/model_zoo.py --autocast --reference-none` (docs/NOISE.md,
"Without a reference"). Those updates are judged by `grad_rtol_apart` (never below
`grad_rtol`), and their losses by `loss_rtol_apart`; a bug in the accumulation shows at
update 0, judged by `grad_rtol`, and in the weights.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from ..runs.model import Run
from .distributed import listed
from .metrics import TensorDiff
from .results import UpdateResult
from .tolerances import Tolerances


def judge_apart(results: list[UpdateResult], tol: Tolerances) -> list[str]:
    """Widen the gradient tolerance to `tol.grad_rtol_apart`, and the loss's to
    `tol.loss_rtol_apart`, at every update entered with weights that differ (each result's
    `entered_apart`, set as the update was judged); a note names what passes only by them."""
    rtol = max(tol.grad_rtol, tol.grad_rtol_apart)
    loss_extra = max(tol.loss_rtol_apart - tol.loss_rtol, 0.0)
    if rtol <= tol.grad_rtol and not loss_extra:
        return []
    widened: list[tuple[int, str, float]] = []
    losses: list[tuple[int, float]] = []
    for result in results:
        if not result.entered_apart:
            continue
        for i, d in enumerate(result.grads):
            wide = _widened(d, _apart_extra(tol))
            if wide.ok and not d.ok:
                widened.append((result.update, d.name, d.rel_l2))
            result.grads[i] = wide
        if loss_extra and result.loss_noise is None and math.isfinite(result.base_loss):
            failed = not result.loss_ok
            result.loss_allowed += loss_extra * abs(result.base_loss)
            if failed and result.loss_ok:
                losses.append((result.update, result.loss_error / abs(result.base_loss)))
    notes = [_note(widened, tol, rtol)] if widened else []
    return notes + ([_loss_note(losses, tol)] if losses else [])


def passes(d: TensorDiff, tol: Tolerances, apart: bool, clearly: bool = False) -> bool:
    """Whether a gradient passes by the tolerance `judge_apart` judges it by once every update
    is in: grad_rtol, or grad_rtol_apart where the runs entered the update with weights apart
    (`apart`; `entered_apart`). The drift (judge/drift.py) counts the merged run's steps where
    its gradient passed: by grad_rtol alone, a bfloat16 gradient that passes by
    grad_rtol_apart widened nothing, and its weights failed by the noise it passed with.
    `clearly`: within what is allowed without a sketch estimator's bound."""
    ok = d.clearly_ok if clearly else d.ok
    if ok or not apart:
        return ok
    wide = _widened(d, _apart_extra(tol))
    return wide.clearly_ok if clearly else wide.ok


def _apart_extra(tol: Tolerances) -> float:
    """What grad_rtol_apart adds to grad_rtol (none where it is the smaller)."""
    return max(tol.grad_rtol, tol.grad_rtol_apart) - tol.grad_rtol


def entered_apart(before: UpdateResult | None, i: int, base: Run, merged: Run) -> bool:
    """Whether the runs entered update `i` with weights apart: `before`, the update before it
    as judged, `parted` (False at the first update, or without it)."""
    return before is not None and before.update == i - 1 and parted(before, base, merged)


def parted(result: UpdateResult, base: Run, merged: Run) -> bool:
    """Whether the two runs' weights after this update differ: by the weights' fingerprints
    where both runs recorded them (the same tensors in the same order: `check_compatible`),
    else by the judged weights (any raw or estimated gap)."""
    i = result.update
    if _state_known(base, i) and _state_known(merged, i):
        return not np.array_equal(base.update_state[i], merged.update_state[i])  # type: ignore[index]
    return any(d.error > 0 or d.max_abs > 0 for d in result.weights)


def _state_known(run: Run, i: int) -> bool:
    """Whether the run recorded its weights' fingerprints after update `i`."""
    state, known = run.update_state, run.update_state_known
    return state is not None and i < len(state) and (known is None or bool(known[i]))


def _widened(d: TensorDiff, extra: float) -> TensorDiff:
    """`d` with `extra`·||g_base|| more allowed (a gradient judged by its noise is left)."""
    if d.noise is not None or d.error == 0 or not 0 < d.rel_l2 < float("inf"):
        return d
    norm = d.error / d.rel_l2
    return dataclasses.replace(d, allowed=d.allowed + extra * norm)


def _loss_note(losses: list[tuple[int, float]], tol: Tolerances) -> str:
    updates = [u for u, _ in losses]
    worst = max(r for _, r in losses)
    return (
        f"without a reference, the loss at update(s) {listed([str(u) for u in updates], 5)} "
        f"differed by more than loss_rtol {tol.loss_rtol:g} of itself (up to {worst:.3g}) and "
        f"passes by loss_rtol_apart {tol.loss_rtol_apart:g}: the runs entered those updates "
        "with weights that differ, and a loss computed in a 16-bit dtype at other weights is "
        "rounded otherwise; a float64 reference judges it by its measured noise instead"
    )


def _note(widened: list[tuple[int, str, float]], tol: Tolerances, rtol: float) -> str:
    updates = sorted({u for u, _, _ in widened})
    names = sorted({n for _, n, _ in widened})
    worst = max(r for _, _, r in widened)
    span = f"{updates[0]}" if len(updates) == 1 else f"{updates[0]}-{updates[-1]}"
    return (
        f"without a reference, {len(widened)} gradient(s) at update(s) {span} "
        f"({listed(names, 3)}) differed by more than grad_rtol {tol.grad_rtol:g} of their "
        f"norm (up to {worst:.3g}) and pass by grad_rtol_apart {rtol:g}: the runs entered "
        "those updates with weights that differ, and a gradient evaluated in a 16-bit dtype at "
        "other weights is rounded otherwise; a float64 reference judges them by their measured "
        "noise instead"
    )
