"""Without a reference: gradients at updates the two runs enter with different weights.

At update 0 both runs evaluate their gradients at the same weights over the same samples, so
in any dtype they differ only by the order of the sums. From the first update whose weights
came out of the previous one differently, each run evaluates its gradient at its own weights.
In a 16-bit compute dtype that rounds every activation otherwise (and flips the ReLUs and
max-pools that sit within a rounding), so two correct runs' gradients differ by far more than
at update 0: measured on `bench/model_zoo.py --autocast --reference-none` (README, "Fixed
tolerances"). Those updates are judged by `grad_rtol_apart` (never below `grad_rtol`); a bug in
the accumulation shows at update 0, judged by `grad_rtol`, and in the weights.
"""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np

from ..runs.model import Run
from .metrics import TensorDiff
from .results import UpdateResult
from .tolerances import Tolerances


def judge_apart(results: list[UpdateResult], tol: Tolerances, base: Run, merged: Run) -> list[str]:
    """Widen the gradient tolerance to `tol.grad_rtol_apart` at every update entered with
    weights that differ (`parted`); a note names the gradients that pass only by it."""
    rtol = max(tol.grad_rtol, tol.grad_rtol_apart)
    if rtol <= tol.grad_rtol:
        return []
    widened: list[tuple[int, str, float]] = []
    for before, result in itertools.pairwise(results):
        if not parted(before, base, merged):
            continue
        for i, d in enumerate(result.grads):
            wide = _widened(d, rtol - tol.grad_rtol)
            if wide.ok and not d.ok:
                widened.append((result.update, d.name, d.rel_l2))
            result.grads[i] = wide
    return [_note(widened, tol, rtol)] if widened else []


def parted(result: UpdateResult, base: Run, merged: Run) -> bool:
    """Whether the two runs' weights after this update differ: by the weights' fingerprints
    where both runs recorded them, else by the judged weights (any raw or estimated gap)."""
    i = result.update
    rows = [_state_row(run, i) for run in (base, merged)]
    if rows[0] is not None and rows[1] is not None:
        return bool(rows[0] != rows[1])
    return any(d.error > 0 or d.max_abs > 0 for d in result.weights)


def _state_row(run: Run, i: int) -> dict[str, int] | None:
    """Each tensor's fingerprint after update `i`, by name, or None where not recorded."""
    state, known = run.update_state, run.update_state_known
    if state is None or i >= len(state) or (known is not None and not known[i]):
        return None
    if state.shape[1] != len(run.tensors):
        return None
    return {t.name: int(v) for t, v in zip(run.tensors, np.asarray(state[i]), strict=True)}


def _widened(d: TensorDiff, extra: float) -> TensorDiff:
    """`d` with `extra`·||g_base|| more allowed (a gradient judged by its noise is left)."""
    if d.noise is not None or d.error == 0 or not 0 < d.rel_l2 < float("inf"):
        return d
    norm = d.error / d.rel_l2
    return dataclasses.replace(d, allowed=d.allowed + extra * norm)


def _note(widened: list[tuple[int, str, float]], tol: Tolerances, rtol: float) -> str:
    updates = sorted({u for u, _, _ in widened})
    names = sorted({n for _, n, _ in widened})
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    worst = max(r for _, _, r in widened)
    span = f"{updates[0]}" if len(updates) == 1 else f"{updates[0]}-{updates[-1]}"
    return (
        f"without a reference, {len(widened)} gradient(s) at update(s) {span} ({shown}) differed "
        f"by more than grad_rtol {tol.grad_rtol:g} of their norm (up to {worst:.3g}) and pass "
        f"by grad_rtol_apart {rtol:g}: the runs entered those updates with weights that differ, "
        "and a gradient evaluated in a 16-bit dtype at other weights is rounded otherwise; a "
        "float64 reference judges them by their measured noise instead"
    )
