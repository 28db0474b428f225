"""The norms before clipping of both runs, judged update by update: a clip that engaged in both
runs steps with the same clipped gradient whatever scale its loss had, so only these norms keep
a loss not divided by K (`signatures.clipping.scale_before_clip` names it)."""

from __future__ import annotations

import math

import numpy as np

from ..runs.model import Run
from .results import FAIL, NOT_CHECKED, PASS, Check, UpdateResult

PRE_CLIP = "grad_norm_pre_clip"  # the problem key of a norm before clipping that differs
CLIPS = "clip calls per window"
RANK_NORMS = "one norm before clipping on every rank"


def clipped_inside(base: Run, merged: Run, updates: list[int]) -> list[int]:
    """Of `updates`, the windows in which the merged run clipped more often than the baseline's
    update, which clipped (the Recorder's counts, `update/clip_calls`): it clipped partial sums
    inside the window, and its norm before clipping is its first clip's, of a partial sum."""
    calls, once = merged.clip_calls, base.clip_calls
    if calls is None or once is None:
        return []
    n = min(len(calls), len(once))
    return [i for i in updates if i < n and once[i] >= 1 and calls[i] > once[i]]


def clip_calls_check(base: Run, merged: Run, results: list[UpdateResult]) -> Check | None:
    """The clip calls per window against the baseline's per update, where both runs counted
    clips: a clip inside the window fails here whether or not it engaged in this run (it clips
    a partial sum as soon as that reaches the threshold; `signatures.clipping` names it)."""
    if base.clip_calls is None or merged.clip_calls is None:
        return None
    updates = [r.update for r in results]
    inside = clipped_inside(base, merged, updates)
    if not inside:
        return Check(CLIPS, PASS, "no window clipped more often than the baseline's update")
    i = inside[0]
    return Check(
        CLIPS,
        FAIL,
        f"{len(inside)}/{len(updates)} windows clipped more often than the baseline's update; "
        f"first, window {i}: {int(merged.clip_calls[i])} calls against "
        f"{int(base.clip_calls[i])}",
    )


def ranks_apart(base: Run, merged: Run) -> tuple[list[int], np.ndarray] | None:
    """The updates at which the merged run's ranks clipped (a call at a finite threshold,
    `update/clip_calls`) with norms before clipping that differ, and those norms ([W, N]; None
    where a rank kept none). An all-reduce hands every rank the same gradient bits, so a clip
    after it sees one norm on all ranks: each rank that saw another clipped its own share before
    the reduce. A norm only logged (an infinite max_norm) clips nothing and is not counted, nor
    is a window clipped inside (its norm is a partial sum's: `clip_calls_check` judges it)."""
    norms, calls = [r.grad_norm_pre_clip for r in merged.ranks], merged.clip_calls
    if len(norms) < 2 or calls is None or any(n is None for n in norms):
        return None
    table = np.stack(norms)  # [W, N]
    low, high = table.min(axis=0), table.max(axis=0)
    apart = np.isfinite(low) & (high > low * (1 + 1e-6)) & (calls[: table.shape[1]] >= 1)
    updates = [int(u) for u in np.flatnonzero(apart)]
    inside = set(clipped_inside(base, merged, updates))
    return [u for u in updates if u not in inside], table


def rank_norms_check(base: Run, merged: Run, replicas: bool) -> Check | None:
    """Ranks that step as replicas (`replicas`) clip after their gradients are reduced, each
    seeing one norm; each rank's own norm before clipping is compared (None: one process, or
    no rank kept its norms). A clip before the reduce fails here whether or not it engaged in
    this run: it clips a rank's share as soon as that reaches the threshold."""
    found = ranks_apart(base, merged) if replicas else None
    if found is None:
        return None
    updates, table = found
    if not updates:
        return Check(RANK_NORMS, PASS, f"the {table.shape[0]} ranks clipped by one norm")
    u = updates[0]
    seen = ", ".join(f"rank {r} {table[r, u]:.6g}" for r in range(table.shape[0]))
    return Check(
        RANK_NORMS,
        FAIL,
        f"{len(updates)}/{table.shape[1]} updates clipped by other norms on the ranks; first, "
        f"update {u}: {seen}",
    )


def pre_clip_check(
    base: Run,
    merged: Run,
    results: list[UpdateResult],
    grad_rtol: float = 0.0,
    calibrated: bool = False,
) -> Check:
    """The norms before clipping, judged by `pre_clip_gap`; each update that fails gets a
    problem. A clip that engaged in both runs steps with the same clipped gradient whatever
    scale the loss had (a loss not divided by K): only these norms keep it, against a reference
    as without one."""
    name = "norms before clipping"
    partial = set(clipped_inside(base, merged, [r.update for r in results]))
    gaps = (
        None
        if r.update in partial
        else pre_clip_gap(base, merged, r, grad_rtol if calibrated else None)
        or printed_gap(base, merged, r, grad_rtol)
        for r in results
    )
    judged = [(r, gap) for r, gap in zip(results, gaps, strict=True) if gap is not None]
    if not judged:
        why = "no update with a judged gradient to compare them by"
        if partial:
            why = (
                f"not compared: the merged run clipped inside {len(partial)} window(s) ({CLIPS}), "
                "where its norm is a partial sum's; no other update had a judged gradient"
            )
        return Check(name, NOT_CHECKED, why)
    bad = [(r, gap) for r, gap in judged if not gap[2] <= gap[3]]
    for r, (m, b, _, share) in bad:
        text = (
            f"norm before clipping {m:.6g} in merged, {b:.6g} in baseline ({m / b:.4g} times; "
            f"the gradient tolerance allows {share:.2g} of the norm)"
        )
        r.problems.append((PRE_CLIP, text))
    if bad:
        r = bad[0][0]
        text = next(t for key, t in r.problems if key == PRE_CLIP)
        return Check(
            name,
            FAIL,
            f"{len(bad)}/{len(results)} updates differ; first, update {r.update}: {text}",
        )
    worst = max(gap / share if share > 0 else math.inf for _, (_, _, gap, share) in judged)
    return Check(name, PASS, f"within the gradient tolerance at every update ({worst:.2g}x it)")


def pre_clip_gap(
    base: Run, merged: Run, r: UpdateResult, floor: float | None = None
) -> tuple[float, float, float, float] | None:
    """At one update, the norms before clipping (merged, baseline), their relative gap
    |m - b| / b, and the share of the stepped gradient's norm the gradient check allowed it
    there (None: not judged: either norm missing, or no gradient judged). `floor` (against a
    reference): the gradient check judged each tensor's distance to the reference, so the
    share bounds |‖m‖ - ‖r‖| and the baseline's own noise |‖b‖ - ‖r‖| adds to it; at least
    `floor` (the dtype's `grad_rtol`: never stricter than the same runs without a reference).

    The clip scales the accumulated gradient by one factor, so the share the gradients check
    allows the stepped gradient, sqrt(sum allowed^2) / ||g_base|| over the judged tensors, is the
    share it allows the unclipped one, and by the triangle inequality, |‖m‖ - ‖b‖| <= ‖m - b‖,
    it bounds the gap of their norms. That share is the dtype's `grad_rtol` (as overridden),
    `grad_rtol_apart` where the runs entered the update with weights that differ (judge/apart.py
    widens the allowance before the checks are built), and more where a kink widened it (an
    excused gradient counts as allowed its own error): a clean run cannot fail here where its
    unclipped gradient would pass. Clean float32 runs' norms differ by rounding, about 1e-7 of
    the norm, against grad_rtol 1e-4; a loss not divided by K under a clip that always engages
    steps with the same clipped gradient, and only these norms keep the scale (K times)."""
    found = _norms_at(base, merged, r.update)
    if found is None:
        return None
    allowed, noise, norms = 0.0, 0.0, 0.0
    for d in r.grads:
        if not (0 < d.rel_l2 < math.inf and math.isfinite(d.allowed)):
            continue  # an equal (or zero) tensor: the diff does not give its norm
        allowed += (max(d.allowed, d.error) if d.excused is not None else d.allowed) ** 2
        if floor is not None and d.noise is not None and math.isfinite(d.noise):
            noise += d.noise**2
        norms += (d.norm if d.norm is not None else d.error / d.rel_l2) ** 2  # ‖b‖
    if not norms:
        return None
    share = (math.sqrt(allowed) + math.sqrt(noise)) / math.sqrt(norms)
    return *found, share if floor is None else max(share, floor)


def printed_gap(
    base: Run, merged: Run, r: UpdateResult, grad_rtol: float
) -> tuple[float, float, float, float] | None:
    """`pre_clip_gap` for runs that print their norms and no gradient (logs): the share
    allowed is the gradients' tolerance plus what printing rounded both norms to."""
    qb, qm, i = base.grad_norm_quantum, merged.grad_norm_quantum, r.update
    if base.has_grads or merged.has_grads or qb is None or qm is None:
        return None
    found = _norms_at(base, merged, i)
    if found is None:
        return None
    m, b, gap = found
    return m, b, gap, grad_rtol + float(qb[i] + qm[i]) / b


def _norms_at(base: Run, merged: Run, i: int) -> tuple[float, float, float] | None:
    """Update i's norms before clipping (merged, baseline) and their relative gap |m - b| / b;
    None where either run lacks them or the baseline's is not finite and positive (a non-finite
    gradient is the gradients check's)."""
    pb, pm = base.grad_norm_pre_clip, merged.grad_norm_pre_clip
    if pb is None or pm is None or i >= min(len(pb), len(pm)):
        return None
    b, m = float(pb[i]), float(pm[i])
    if not (math.isfinite(b) and b > 0):
        return None
    return m, b, abs(m - b) / b if math.isfinite(m) else math.inf
