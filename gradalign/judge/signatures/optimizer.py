"""The optimizer was told other settings than the baseline's: weight decay, betas, momentum, eps
(the manifest's `optimizer`, per tensor: groups listed in another order or split otherwise
compare alike). Accumulation changes none of them."""

from __future__ import annotations

from ..distributed import listed
from ..results import Comparison, Diagnosis
from ..settings_apart import settings_apart
from .common import window
from .learning_rate import lined_up_lrs, lr_schedule, schedule_offset

CYCLED = {"momentum", "betas"}  # what a schedule cycles beside the lr (CyclicLR, OneCycleLR)


def optimizer_settings(c: Comparison) -> Diagnosis | None:
    """Both runs recorded their optimizer's settings, and a setting both list differs for some
    tensor both optimizers step. A setting one group lists and the other does not says nothing
    (a wrapper such as ZeroRedundancyOptimizer lists only what it was given), nor does the
    optimizer's class (the wrapper's name, where the baseline names the optimizer it wraps)."""
    base, merged = c.baseline.optimizer_settings, c.merged.optimizer_settings
    if not base or not merged:
        return None
    differ = settings_apart(base, merged, [t.name for t in c.baseline.tensors])
    if not differ or ({key for key, _, _ in differ} <= CYCLED and _lr_stepped_otherwise(c)):
        return None  # the momentum a schedule cycled, stepped otherwise (`lr-schedule`)
    shown = [
        f"{key} {vb} in the baseline, {vm} in the merged run ({listed(tensors, 3)})"
        for (key, vb, vm), tensors in differ.items()
    ]
    return Diagnosis(
        "optimizer-settings",
        "the optimizers were given other settings: "
        + "; ".join(shown[:4])
        + (f"; and {len(shown) - 4} more" if len(shown) > 4 else ""),
        {
            "differences": [
                {"setting": key, "baseline": vb, "merged": vm, "tensors": len(tensors)}
                for (key, vb, vm), tensors in differ.items()
            ]
        },
        "give the merged optimizer the baseline's settings: accumulating K micro-batches of "
        "B/K is the batch of B, so no setting changes with K (only a loop's own bug does)",
    )


def _lr_stepped_otherwise(c: Comparison) -> bool:
    """Whether the merged lr is the baseline's schedule at another pace or offset (the lrs
    `lr_schedule` reads), or `lr-schedule` names its schedule stepped otherwise (a OneCycleLR
    sized for micro-steps and stepped at each: its momentum cycled before the first step)."""
    base, merged = lined_up_lrs(c)
    if base is None or merged is None:
        return False
    return schedule_offset(base, merged, (window(c),)) is not None or lr_schedule(c) is not None
