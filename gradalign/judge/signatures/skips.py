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
from ..distributed import listed
from ..results import Comparison, Diagnosis
from .clipping import SCALE_ONCE, hidden_scale
from .common import window, window_scale
from .norms import apart
from .window_steps import inner_steps, scaler_per_micro

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


def _unscaled(c: Comparison, apart: list[int]) -> list[int]:
    """The first update of `apart`, where the merged run skipped at a loss scale no higher than
    the one its baseline stepped at: each merged micro-batch's gradient is about 1/K of the
    baseline's, so the scale cannot explain that overflow. Later ones say nothing: the runs
    trained apart from the first on, their gradients no longer the same."""
    n = len(c.results)
    merged_skipped = scaler_skipped(c.merged, n)
    found = []
    for u in apart[:1]:
        sm, sb = _scale(c.merged, u), _scale(c.baseline, u)
        if merged_skipped[u] and (sm is None or sb is None or sm <= sb):
            found.append(u)
    return found


def scaler_skips(c: Comparison) -> Diagnosis | None:
    """The runs' GradScalers skipped different updates, each explained by the scales (not by a
    scaler driven inside the window, which `scaler-per-micro` names, nor by a gradient that was
    not finite whatever the scale, `overflow_carried`)."""
    apart = skips_apart(c)
    if not apart or scaler_per_micro(c) is not None or _stepped_inside(c):
        return None
    unscaled = _unscaled(c, apart)
    if unscaled:  # an overflow no scale explains: a gradient too large, its scale hidden by a clip
        u = unscaled[0]
        seen = (
            f"the merged run's GradScaler overflowed at update {u}, at a loss scale its baseline "
            "stepped at"
        )
        return hidden_scale(c, seen, {"overflowed_at_update": u}) or _scaled_after(c, u, seen)
    n = len(c.results)
    u = apart[0]
    skipped = {name: [int(i) for i in np.flatnonzero(scaler_skipped(r, n))] for name, r in _runs(c)}
    by_merged = u in skipped["merged"]
    who, other = ("merged run", "baseline") if by_merged else ("baseline", "merged run")
    scale = _scale(c.merged if by_merged else c.baseline, u)
    at = f" at loss scale {scale:g}" if scale is not None else ""
    shown = {name: listed([str(i) for i in ups], _SHOWN) or "none" for name, ups in skipped.items()}
    before = all(r.ok for r in c.results[:u])
    if not before:  # the runs parted before the scalers did: that cause is another's to name
        return None
    lowest = _lowest_stepped(c, n)
    evidence: dict = {
        "first_update": u,
        "skipped_by": who.split()[0],
        "updates_apart": len(apart),
        "baseline_skipped": skipped["baseline"],
        "merged_skipped": skipped["merged"],
        "loss_scale": scale,
        "aligned_before": before,
    }
    message = (
        f"the GradScalers skipped different updates: at update {u} the {who}'s scaled gradient "
        f"overflowed{at} and its step was skipped, while the {other} stepped "
        f"(skipped: baseline {shown['baseline']}; merged {shown['merged']}). A float16 "
        "gradient overflows by its size in one backward, K times smaller per micro-batch when "
        "accumulated, so dynamic loss scaling skips other updates at K=1 than at K>1: not an "
        f"accumulation bug, but from update {u} the two runs train differently"
    )
    if u:
        message += "; the updates before it are within what is allowed"
    seen = f"; {lowest:g} is the lowest scale either run stepped at here" if lowest else ""
    fix = (
        f"start both runs' GradScaler at a scale neither overflows at (GradScaler(init_scale=S)"
        f"{seen}), so that both step at every update, and record them again; a float64 "
        "reference skips what its baseline skipped: Recorder(..., "
        "skip_updates=gradalign.skipped_updates(BASELINE))"
    )
    if "log" in (c.baseline.kind, c.merged.kind):  # a log's scaler is its framework's
        fix = (
            "start both runs' loss scaler at a scale neither overflows at (Megatron-LM's "
            f"--initial-loss-scale S{seen}), so that both step at every update, and log them again"
        )
    return Diagnosis("scaler-skips", message, evidence, fix)


NEAR_SCALE = math.log(1.25)  # the runs part at the overflow: a scale is read within 25%


def _scaled_after(c: Comparison, u: int, seen: str) -> Diagnosis | None:
    """`loss-scale` where no clip hid the scale: at the first later update both runs stepped,
    the merged gradient is nearer K, 1/K or K+1 times the baseline's than 1 and within 25% of
    it (the runs trained apart from the overflow on, so no closer reading is due)."""
    n, k = len(c.results), window(c)
    skipped = [scaler_skipped(r, n) for _, r in _runs(c)]
    for r in c.results[u + 1 :]:
        if any(s is None or s[r.update] for s in skipped) or not r.grads:
            continue
        ratio = r.grad_ratio
        if ratio is None or not math.isfinite(ratio) or ratio <= 0:
            return None
        near = min((k, 1 / k, k + 1, 1.0), key=lambda v: apart(ratio, v))
        if near == 1.0 or apart(ratio, near) > NEAR_SCALE:
            return None
        return Diagnosis(
            "loss-scale",
            f"{seen}: its scaled backward overflowed where the baseline's, of a gradient K "
            f"times each micro-batch's, did not, and at update {r.update}, the first both "
            f"stepped after it, the merged gradient is {ratio:.4g} times the baseline's (near "
            f"{window_scale(k, near)}; the runs trained apart from update {u}): the loss is "
            "scaled by the wrong factor",
            {
                "overflowed_at_update": u,
                "update": r.update,
                "grad_ratio": ratio,
                "expected_ratio": near,
            },
            SCALE_ONCE,
        )
    return None


def _stepped_inside(c: Comparison) -> bool:
    """The merged run stepped inside a window, or more often than once per update: what its
    scaler did then is `step-in-window`'s consequence."""
    steps = c.merged.optimizer_steps
    return bool(inner_steps(c.merged)) or (steps is not None and bool((steps > 1).any()))


def _runs(c: Comparison) -> list[tuple[str, Run]]:
    return [("baseline", c.baseline), ("merged", c.merged)]


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


def overflow_carried(c: Comparison) -> Diagnosis | None:
    """The merged run's GradScaler skipped an update at a scale its baseline stepped at, and
    every update after it while the scale kept halving: an inf or NaN that stays in .grad from
    window to window. The gradients are not cleared after the step, so the overflow of a window
    the scaler skipped is never dropped (the baseline's gradient, K times each micro-batch's, was
    finite at that scale)."""
    n = len(c.results)
    apart = skips_apart(c)
    unscaled = _unscaled(c, apart)
    merged_skipped = scaler_skipped(c.merged, n)
    if not unscaled or merged_skipped is None:
        return None
    u = unscaled[0]
    if u >= n - 1 or not merged_skipped[u:].all():
        return None  # one overflow the scale does not explain is no carried inf
    sm, sb, last = _scale(c.merged, u), _scale(c.baseline, u), _scale(c.merged, n - 1)
    evidence = {
        "first_update": u,
        "merged_skipped": [int(i) for i in np.flatnonzero(merged_skipped)],
        "merged_loss_scale": sm,
        "baseline_loss_scale": sb,
        "merged_last_loss_scale": last,
    }
    down = f", down to {last:g}" if last is not None and last != sm else ""
    return Diagnosis(
        "grad-not-cleared",
        f"the merged run's GradScaler skipped every update from {u} on ({n - u} of {n}) at loss "
        f"scales from {sm:g}{down}, where the baseline stepped at {sb:g} with a gradient K times "
        "the size of each merged micro-batch's: an inf or NaN stayed in .grad from window to "
        "window, as when the gradients are never cleared and a skipped window's overflow is "
        "never dropped",
        evidence,
        "clear the gradients after every optimizer step, whether or not the scaler skipped it "
        "(optimizer.zero_grad() after scaler.step() and scaler.update())",
    )


def steps_skipped(c: Comparison) -> list[int]:
    """Updates where the merged run made fewer optimizer steps than its baseline, in runs whose
    merged optimizer never stepped more often, never inside a window, and whose GradScalers (if
    any) did not part: a skip decided otherwise (a loss-spike or non-finite check on one
    micro-batch's loss, not the window's)."""
    base, merged, n = c.baseline.optimizer_steps, c.merged.optimizer_steps, len(c.results)
    if base is None or merged is None or inner_steps(c.merged) or skips_apart(c):
        return []
    sb, sm = np.asarray(base[:n]), np.asarray(merged[:n])
    if (sm > sb).any():
        return []
    return [int(u) for u in np.flatnonzero(sm < sb)]


def step_skipped(c: Comparison) -> Diagnosis | None:
    skipped = steps_skipped(c)
    if not skipped:
        return None
    first = skipped[0]
    return Diagnosis(
        "step-skipped",
        f"the merged run did not step its optimizer at update"
        f"{'s' if len(skipped) > 1 else ''} {listed([str(u) for u in skipped], _SHOWN)}, where "
        "the baseline did: a skip decided otherwise than the baseline's, such as a loss-spike "
        "or non-finite check read from one micro-batch's loss or gradient instead of the "
        "window's",
        {"updates_skipped": len(skipped), "first_update": first},
        "decide whether to skip once per window, after its K-th micro-batch, from what the "
        "baseline decides it by: the window's loss (summed over its micro-batches) or the "
        "accumulated gradient's norm",
    )
