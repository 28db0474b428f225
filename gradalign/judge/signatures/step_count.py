"""The optimizer's own step counter (Adam's t, read from its state after each update) against
the baseline's, where step() itself ran as often and never inside a window: counted per
micro-step, or started over (the state cleared, the optimizer made anew)."""

from __future__ import annotations

import numpy as np

from ..results import Comparison, Diagnosis
from ..windows import observable_windows
from .common import window

_RESET = (
    "the optimizer's state started over there (its moments and step count: an optimizer made "
    "anew, or its state cleared or loaded from elsewhere, in the merged run)"
)
_KEEP_STATE = (
    "keep one optimizer and its state for the whole run: create it once, outside the training "
    "loop, and restore its state_dict together with the weights when resuming"
)


def counter_only(c: Comparison) -> bool:
    """The optimizer's own step counter differs from the baseline's while step() ran as often
    and never inside a window: recorded per update, or shown by weights that never changed
    inside an observable window."""
    problems = {k for r in c.results for k, _ in r.problems}
    if "state_step" not in problems or problems & {"optimizer_steps", "window"}:
        return False
    if c.merged.optimizer_steps is not None and c.baseline.optimizer_steps is not None:
        return True
    return observable_windows(c.merged) > 0


def step_count(c: Comparison) -> Diagnosis | None:
    """A step counter advanced per micro-step: Adam's t (a framework's beta-power accumulators)
    counted in every micro-step of a hand-written merge while the step itself ran once per
    window, so the bias correction weighs every step otherwise."""
    if not counter_only(c):
        return None
    counted = [r for r in c.results if any(k == "state_step" for k, _ in r.problems)]
    first, last = counted[0].update, counted[-1].update
    state_m, state_b = c.merged.state_step, c.baseline.state_step
    assert state_m is not None and state_b is not None  # a state_step problem reads both
    qm, qb, k = int(state_m[last]), int(state_b[last]), window(c)
    fell = _fell(state_m, last)
    how = (
        f"{k} times the baseline's (K={k}): it counted micro-steps, not updates"
        if qb > 0 and qm == k * qb
        else f"it fell from {fell[1]} to {fell[2]} at update {fell[0]}: {_RESET}"
        if fell is not None
        else "it advanced otherwise than the updates"
    )
    return Diagnosis(
        "step-count",
        f"the optimizer's own step count (the t of Adam's bias correction) was {qm} after update "
        f"{last} against the baseline's {qb}, {how}, while step() ran as often as the "
        "baseline's and never inside a window: Adam's bias correction (1 - beta^t) then weighs "
        "its steps otherwise",
        {
            "first_update": first,
            "merged_state_step": qm,
            "baseline_state_step": qb,
            "at_update": last,
            "updates_differing": len(counted),
        },
        _KEEP_STATE
        if fell is not None
        else "advance the optimizer's step count once per window, with the step that applies "
        "the merged gradient: in a hand-written or framework gradient merge, Adam's t and its "
        "beta1^t, beta2^t power accumulators belong to the update, not to each micro-batch",
    )


def group_counters(c: Comparison) -> dict[str, tuple[int, int]]:
    """Counters in the optimizers' param groups (entries the Recorder saw change between the
    first two steps: the manifest's `optimizer.counters`) that the merged run advanced per
    micro-step: a whole number > 0 after the baseline's first step, K times it after the merged
    run's (a hand-written optimizer keeping its bias correction's t in `param_groups`: 1
    against K). {entry: (baseline's, merged's)}."""
    from ...runs.schema import is_int
    from ..settings_apart import per_tensor

    base, merged = c.baseline.optimizer_settings, c.merged.optimizer_settings
    k = window(c)
    if not base or not merged or k < 2:
        return {}
    counted = set(merged.get("counters", []))
    found = {}
    for b, m in zip(per_tensor(base), per_tensor(merged), strict=True):
        for key in counted & set(b or {}) & set(m or {}):
            vb, vm = b[key], m[key]  # type: ignore[index]
            if is_int(vb) and is_int(vm) and vb > 0 and vm == k * vb:
                found[key] = (vb, vm)
    return found


def group_step_count(c: Comparison) -> Diagnosis | None:
    """A step counter a loop keeps in its optimizer's param groups (a hand-written Adam's t)
    advanced per micro-step, read off the settings recorded after the first step: named with
    the counters, not as `optimizer-settings` ("t 1 in the baseline, 4 in the merged run", a
    fix about giving the merged optimizer the baseline's settings; a cold probe's loop)."""
    counters = group_counters(c)
    if not counters:
        return None
    k = window(c)
    shown = ", ".join(f"{key} {m} against the baseline's {b}" for key, (b, m) in counters.items())
    return Diagnosis(
        "step-count",
        f"the optimizer's param groups hold a counter that advanced per micro-step: {shown} "
        f"after the first step, K={k} times the baseline's: it counted micro-steps, not "
        "updates, so whatever it drives (a bias correction's t, a schedule of its own) weighs "
        "every step otherwise",
        {
            "counters": {key: {"baseline": b, "merged": m} for key, (b, m) in counters.items()},
            "K": k,
        },
        "advance the counter once per window, with the step that applies the merged gradient: "
        "in a hand-written optimizer or gradient merge, a bias correction's t belongs to the "
        "update, not to each micro-batch",
    )


def _fell(steps: np.ndarray, last: int) -> tuple[int, int, int] | None:
    """The first update (up to `last`) after which the step count stood below the update
    before's, with the two counts; None where it never fell."""
    for i in range(1, last + 1):
        if 0 <= steps[i] < steps[i - 1]:
            return i, int(steps[i - 1]), int(steps[i])
    return None
