"""Gradient jumps the baseline makes against the reference too (judge/kinks.py says what a
jump is): over a long run a model with many near-ties crosses kinks at many updates, and only
the baseline and the reference say where and how a jump looks, so a bug in the merged run
cannot widen what is excused here."""

from __future__ import annotations

import math

import numpy as np

from ..runs.model import Run
from .kink_evidence import apart
from .kink_shape import JUMP_OWN_SHARE
from .kinks import excuse, gradients_alone_failed
from .results import UpdateResult
from .views import Sketching

JUMP_OUTLIER = 10.0  # a baseline's gradient error this many times its median is a jump ...
JUMP_OWN_ROWS = 8  # ... if at most this many rows hold JUMP_SHARE of it (and JUMP_OWN_SHARE)


def excuse_jumps_like_the_baselines(
    results: list[UpdateResult],
    base: Run,
    merged: Run,
    ref: Run,
    factor: float,
    seen: Sketching | None = None,
) -> list[str]:
    """Excuse gradient jumps the baseline makes against the reference too (module docstring):
    at most `factor` times as many as the baseline's, in the tensors it jumped in, each held in
    as few rows as its own jumps were. One note for all of them."""
    # the loss is judged on its own: a jump at u moves the loss of u + 1
    candidates = [r for r in results if gradients_alone_failed(r)]
    if not candidates:
        return []
    own = _baseline_jumps(results, base, ref, seen)
    jumped_at = sorted(set().union(*(updates for updates, _ in own.values())))
    if not own or len(candidates) > factor * len(jumped_at):
        return []
    rows_seen = {name: rows for name, (_, rows) in own.items()}
    excused = []
    for r in candidates:
        grads = apart(merged, ref, "grads", r.update, seen)
        if grads is None:
            return []
        failing = [d for d in r.grads if not d.ok]
        if not all(
            d.name in rows_seen
            and grads.units(d.name, rows_seen[d.name], JUMP_OWN_SHARE, factor * d.unbounded)
            for d in failing
        ):
            return []
        excused.append((r, failing))
    for r, failing in excused:
        excuse(r, {d.name for d in failing}, "jump")
    tensors = sorted({d.name for _, failing in excused for d in failing})
    at = ", ".join(str(r.update) for r, _ in excused)
    return [
        f"updates {at}: the gradients of {', '.join(tensors)} jumped out of noise in a few "
        "rows while the weights stayed within noise, as the baseline's own "
        f"gradients jumped against the reference at update(s) {', '.join(map(str, jumped_at))} "
        "(an activation or a max crossing its kink in one run and not the other, as the same "
        f"rows show): not counted as failures (at most {factor:g}x the baseline's number)"
    ]


def _baseline_jumps(
    results: list[UpdateResult], base: Run, ref: Run, seen: Sketching | None
) -> dict[str, tuple[set[int], int]]:
    """Per gradient tensor, where the baseline's own error against the reference jumped (over
    JUMP_OUTLIER times its median over the run) and held JUMP_SHARE in few rows: those updates,
    and the most rows any of them needed."""
    series: dict[str, list[tuple[int, float]]] = {}
    for r in results:
        for d in r.grads:
            if d.noise is not None and math.isfinite(d.noise):
                series.setdefault(d.name, []).append((r.update, d.noise))
    found: dict[str, tuple[set[int], int]] = {}
    for name, points in series.items():
        typical = float(np.median([n for _, n in points]))
        for u, noise in points:
            if typical <= 0 or noise <= JUMP_OUTLIER * typical:
                continue
            grads = apart(base, ref, "grads", u, seen)
            if grads is None or name not in grads:
                continue
            units = grads.units(name, JUMP_OWN_ROWS, JUMP_OWN_SHARE)
            if units is not None:
                updates, most = found.get(name, (set(), 0))
                found[name] = (updates | {u}, max(most, len(units[1])))
    return found
