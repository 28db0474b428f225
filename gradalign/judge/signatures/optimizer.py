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
# torch.optim's own classes: a wrapper (ZeroRedundancyOptimizer, a framework's) names itself
# where the other run names the optimizer it wraps, so only two of these are compared
TORCH_OPTIMIZERS = frozenset(
    {"ASGD", "Adadelta", "Adafactor", "Adagrad", "Adam", "AdamW", "Adamax", "LBFGS", "Muon",
     "NAdam", "RAdam", "RMSprop", "Rprop", "SGD", "SparseAdam"}
)  # fmt: skip
ALIKE = frozenset({"Adam", "AdamW"})  # one algorithm: decoupled_weight_decay tells them apart


def optimizer_type(c: Comparison) -> Diagnosis | None:
    """The runs stepped with optimizers of other torch.optim classes (SGD and Adam): another
    training whatever K is. Its lr, momentum or betas differ as a consequence, and were read as
    a scaled lr or nothing (`unexplained`, a cold probe's SGD baseline against an Adam run)."""
    kinds = [(run.optimizer_settings or {}).get("type") for run in (c.baseline, c.merged)]
    if not all(k in TORCH_OPTIMIZERS for k in kinds) or kinds[0] == kinds[1]:
        return None
    if set(kinds) <= ALIKE:
        return None
    return Diagnosis(
        "optimizer-settings",
        f"the runs stepped with other optimizers: {kinds[0]} in the baseline, {kinds[1]} in the "
        "merged run; every update of the merged run is another optimizer's, whatever K is",
        {"differences": [{"setting": "type", "baseline": kinds[0], "merged": kinds[1]}]},
        "build the merged run's optimizer as the baseline's: the same class and settings "
        "(accumulation changes none of them)",
    )


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
