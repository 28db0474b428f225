"""Gradients on parted paths: judged by their size, as far as honest paths' sizes stand apart.

Over a long run a baseline's gradient may part from its reference's for good: a 16-bit
rounding, or an Adam whose small eps multiplies float32's, sets the paths apart, and from some
update on a tensor's two gradients share no direction (the cosine of baseline and reference at
most PARTED, averaged over the updates around: less than a quarter of the reference's energy
along the baseline's). A tensor's check against the reference then measures sizes alone:
||m - r||² is about ||m||² + ||r||², ||b - r||² about ||b||² + ||r||². And sizes on parted paths
differ by the path: attention's logits sharpen at one update on one path and not on another,
and a gradient spikes there to tens of times its size at the updates around. Model zoo run
284001 (Qwen2-MoE under Adam with eps 1e-6, K=2, float32, 300 updates): the baseline's
attention gradients spiked 52x their neighbours' size at update 231, the reference's 15x at
206, the merged run's 153x at 256, which alone failed (38x to 94x its noise at three updates,
each passing before and after); runs 283800 (Llama, bfloat16, 300 updates) and 283032
(Mixtral, bfloat16, 100 updates, a 17x spike at update 71) failed alike.

So at a parted update a gradient's noise is taken to grow with its own run's passing size: the
baseline's noise times the merged run's ||m|| / ||b|| there over that ratio's median at the
parted updates around (±LONG; at least 1), at most the furthest the baseline's and the
reference's sizes of that tensor stood apart at any of its parted updates (what two honest
paths were seen to do). A spike or a stretch of a few updates is widened; a scale the merged
run keeps (a loss not divided by K from some update on) raises the median with it and is judged
at its full size as before, and so is a gradient at an update that is not parted. Where this
alone made gradients pass, a note says so.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from .metrics import TensorDiff
from .noise import POOL, around
from .results import UpdateResult

PARTED = 0.5  # a baseline gradient at this cosine to the reference's, or less, shares no direction
LONG = 2 * POOL + 1  # the updates either side whose median ||m|| / ||b|| is the passing level


def widen_parted_sizes(results: list[UpdateResult], factor: float) -> list[str]:
    """Widen, in place, what parted gradients may differ by (module docstring); a note where
    that alone made some gradient pass."""
    series: dict[str, list[tuple[int, int, TensorDiff]]] = {}
    for u, r in enumerate(results):
        for j, d in enumerate(r.grads):
            series.setdefault(d.name, []).append((u, j, d))
    passed: dict[int, list[str]] = {}
    for name, entries in series.items():
        found = _sizes([d for _, _, d in entries])
        if found is None:
            continue
        b, m, r, cosine = found
        parted = _parted(cosine)
        if not parted.any():
            continue
        spread = float(np.exp(np.abs(np.log(b[parted] / r[parted])).max()))
        ratio = np.where(parted, m / b, np.nan)  # the merged size over the baseline's
        for k, (u, j, d) in enumerate(entries):
            if not parted[k] or d.excused is not None or d.noise is None:
                continue
            near = around(ratio, k, LONG)
            level = max(1.0, float(np.median(near[np.isfinite(near)])))
            grow = min(ratio[k] / level, spread)
            if grow <= 1.0:
                continue
            wider = dataclasses.replace(d, allowed=d.allowed + factor * d.noise * (grow - 1.0))
            results[u].grads[j] = wider
            if wider.ok and not d.ok:
                passed.setdefault(results[u].update, []).append(name)
    return [_note(passed)] if passed else []


def _parted(cosine: np.ndarray) -> np.ndarray:
    """Where the baseline's gradient shares no direction with the reference's: its cosine,
    averaged over the updates around (±POOL, where known), at most PARTED."""
    parted = np.zeros(cosine.shape, dtype=bool)
    for k in range(cosine.size):
        near = around(cosine, k)
        near = near[np.isfinite(near)]
        parted[k] = bool(np.isfinite(cosine[k]) and near.mean() <= PARTED)
    return parted


def _sizes(
    diffs: list[TensorDiff],
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
    """A tensor's ||b||, ||m||, ||r|| and the cosine of b and r at each update, from the
    baseline's noise ||b - r||: NaN at an update without them (a step a GradScaler skipped, a
    size of 0); None where no update has them (no reference, a golden file's summaries)."""
    rows = []
    for d in diffs:
        row = (d.norm, *(d.sizes or (None, None)), d.noise)
        usable = all(x is not None and math.isfinite(x) for x in row) and min(row[:3]) > 0
        rows.append(row if usable else (math.nan,) * 4)
    b, m, r, noise = (np.array(column, dtype=np.float64) for column in zip(*rows, strict=True))
    if np.isnan(b).all():
        return None
    cosine = (b**2 + r**2 - noise**2) / (2.0 * b * r)
    return b, m, r, cosine


def _note(passed: dict[int, list[str]]) -> str:
    updates = sorted(passed)
    names = sorted({n for found in passed.values() for n in found})
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    at = ", ".join(str(u) for u in updates[:8]) + (" ..." if len(updates) > 8 else "")
    return (
        f"update(s) {at}: the gradients of {shown} pass by their size on parted paths: there "
        "the baseline's gradient shared no direction with the reference's (cosine at most "
        f"{PARTED}), so the check measures sizes, and a spike or a short stretch of the merged "
        "gradient's size may stand as far from the baseline's as the baseline's stood from the "
        "reference's at any such update; a size the merged run keeps over the updates around "
        f"(±{LONG}) is judged in full"
    )
