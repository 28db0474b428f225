"""Losses that stand off now and then inside a divergence the judge followed (a kink's, a choice's,
a step scaled by a norm noise moved: judge/kink_divergence.py).

Update u's loss is computed with the weights after update u−1; where those stand apart by a
followed divergence, `noise.explain_loss_by_weights` lets the loss differ by the slope along
the step between the runs' weights. A choice made per input (a token routed to another expert,
an argmax) that goes otherwise on the parted weights moves the loss by a jump, which no slope
explains. Model zoo run 295652 (transformers' Qwen2-MoE under RMSprop, K=4 over micro-batches
of unequal sizes, 30 updates): a kink followed from update 22, then the loss alone 1.33 and 5.1
times what the weights explain at updates 26 and 29 (3.9e-6 and 1.8e-5 off), 27 and 28 within
it, every tensor within the divergence followed; named `loss-averaging`.

A loss recorded otherwise (divided by K, scaled by its micro-batch's share of the batch, summed
over ranks) stands off at every update from the first it does, and by far more than a token's
share of the loss. So such failures are excused only where every failure of the run is a loss
alone, each inside a followed divergence and within the share it follows of the loss itself,
and a later update's loss passed.
"""

from __future__ import annotations

from .results import UpdateResult


def excuse_parted_losses(results: list[UpdateResult]) -> list[str]:
    """Widen, in place, the losses that stand off now and then inside a followed divergence
    (module docstring) to what they stood off by; the note that says so, none otherwise."""
    failing = [r for r in results if r.loss_judged and not r.loss_ok]
    if not failing or any(not r.tensors_ok or r.findings for r in results):
        return []  # no loss failed, or the run fails by more than its losses
    if not all(0 < r.loss_error <= r.followed_share * abs(r.base_loss) for r in failing):
        return []  # off where the runs shared their path, or by more than a share followed
    first = failing[0].update
    if all(not r.loss_ok for r in results if r.update > first and r.loss_judged):
        return []  # off at every update from its first (none after it: unread)
    times = max(r.loss_ratio for r in failing)
    for r in failing:
        r.loss_allowed = r.loss_error
    updates = [r.update for r in failing]
    at = f"update {updates[0]}" if len(updates) == 1 else f"updates {', '.join(map(str, updates))}"
    return [
        f"{at}: the loss alone stood off, up to {times:.3g} times what the weights explain, "
        "inside the divergence followed (each within the share of itself followed there), "
        f"while losses after update {first} passed: once the runs have parted, a choice made per "
        "input (a token routed to another expert, an argmax) moves the loss by a jump that no "
        "slope explains, where a loss recorded otherwise stands off at every update from its "
        "first; not counted as failures"
    ]
