"""Dynamic loss scaling that skipped other updates in the two runs.

A GradScaler skips the optimizer step of a window whose scaled gradients overflow, and halves
its scale. A float16 gradient overflows by its size in one backward: accumulation computes it in
K micro-batches, each K times smaller, so a correct merged run can step where its baseline
skipped (and, once the scales part, the other way). From that update the two runs train
differently, and the step counts, the optimizer's own counter and the weights all differ: the
scalers' choices, not a step inside the window.
"""

from __future__ import annotations

import math

import numpy as np

from ...runs.model import Run
from ..results import Comparison, Diagnosis
from .accumulation import scaler_per_micro

_SHOWN = 6  # skipped updates listed per run


def scaler_skipped(run: Run, n: int) -> np.ndarray | None:
    """bool [n]: the updates at which the run's GradScaler skipped the step (no optimizer step,
    in a run that recorded a loss scale there or counted its scaler's update() call)."""
    if run.optimizer_steps is None:
        return None
    scaled = np.zeros(n, dtype=bool)
    if run.loss_scale is not None:
        scale = np.asarray(run.loss_scale[:n], dtype=np.float64)
        scaled |= np.isfinite(scale) & (scale > 0)
    if run.scaler_calls is not None and run.scaler_calls.size:
        scaled |= np.asarray(run.scaler_calls[:n, 1]) >= 1
    return (np.asarray(run.optimizer_steps[:n]) == 0) & scaled


def skips_apart(c: Comparison) -> list[int]:
    """Updates where one run's GradScaler skipped the step and the other run stepped once."""
    n = len(c.results)
    base, merged = c.baseline, c.merged
    sb, sm = scaler_skipped(base, n), scaler_skipped(merged, n)
    if sb is None or sm is None:
        return []
    once_b = np.asarray(base.optimizer_steps[:n]) == 1
    once_m = np.asarray(merged.optimizer_steps[:n]) == 1
    return [int(u) for u in np.flatnonzero((sb & once_m) | (sm & once_b))]


def scaler_skips(c: Comparison) -> Diagnosis | None:
    """The runs' GradScalers skipped different updates (not explained by a scaler driven inside
    the window, which `scaler-per-micro` names)."""
    apart = skips_apart(c)
    if not apart or scaler_per_micro(c) is not None:
        return None
    n = len(c.results)
    u = apart[0]
    who, other = ("baseline", "merged run")
    if scaler_skipped(c.merged, n)[u]:
        who, other = ("merged run", "baseline")
    run = c.baseline if who == "baseline" else c.merged
    scale = _scale(run, u)
    at = f" at loss scale {scale:g}" if scale is not None else ""
    listed = {name: _listed(scaler_skipped(r, n)) for name, r in _runs(c)}
    before = all(r.ok for r in c.results[:u])
    lowest = _lowest_stepped(c, n)
    evidence: dict = {
        "first_update": u,
        "skipped_by": who.split()[0],
        "updates_apart": len(apart),
        "baseline_skipped": [int(i) for i in np.flatnonzero(scaler_skipped(c.baseline, n))],
        "merged_skipped": [int(i) for i in np.flatnonzero(scaler_skipped(c.merged, n))],
        "loss_scale": scale,
        "aligned_before": before,
    }
    message = (
        f"the GradScalers skipped different updates: at update {u} the {who}'s scaled gradient "
        f"overflowed{at} and its step was skipped, while the {other} stepped "
        f"(skipped: baseline {listed['baseline']}; merged {listed['merged']}). A float16 "
        "gradient overflows by its size in one backward, K times smaller per micro-batch when "
        "accumulated, so dynamic loss scaling skips other updates at K=1 than at K>1: not an "
        f"accumulation bug, but from update {u} the two runs train differently"
    )
    if u:
        message += (
            "; the updates before it are within what is allowed"
            if before
            else "; updates before it already differ"
        )
    seen = f"; {lowest:g} is the lowest scale either run stepped at here" if lowest else ""
    return Diagnosis(
        "scaler-skips",
        message,
        evidence,
        f"start both runs' GradScaler at a scale neither overflows at (GradScaler(init_scale=S)"
        f"{seen}), so that both step at every update, and record them again; a float64 "
        "reference skips what its baseline skipped: Recorder(..., "
        "skip_updates=gradalign.skipped_updates(BASELINE))",
    )


def _runs(c: Comparison) -> list[tuple[str, Run]]:
    return [("baseline", c.baseline), ("merged", c.merged)]


def _listed(skipped: np.ndarray) -> str:
    updates = [str(int(i)) for i in np.flatnonzero(skipped)]
    if not updates:
        return "none"
    return ", ".join(updates[:_SHOWN]) + (", ..." if len(updates) > _SHOWN else "")


def _scale(run: Run, u: int) -> float | None:
    if run.loss_scale is None:
        return None
    value = float(run.loss_scale[u])
    return value if math.isfinite(value) and value > 0 else None


def _lowest_stepped(c: Comparison, n: int) -> float | None:
    """The lowest loss scale at which either run's optimizer stepped."""
    found = [
        float(r.loss_scale[i])
        for _, r in _runs(c)
        if r.loss_scale is not None and r.optimizer_steps is not None
        for i in range(n)
        if r.optimizer_steps[i] >= 1 and math.isfinite(r.loss_scale[i]) and r.loss_scale[i] > 0
    ]
    return min(found) if found else None
