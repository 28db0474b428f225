"""What the loss of an update says of a gradient jump there (judge/kinks.py): whether the
step taken with it moved the training, as far as the loss can tell."""

from __future__ import annotations

from .results import UpdateResult

LOSS_WITHIN = "the loss within noise"
LOSS_AS_AROUND = (
    "the loss off by no more than at the updates either side, which fail as well (losses that "
    "stand off throughout, as losses recorded otherwise do, say nothing of one update's step)"
)


def loss_as_around(results: list[UpdateResult], i: int) -> str | None:
    """What the loss of update `results[i]` says of a jump there, in words: within noise; or
    failing, but by no more (give or take its allowed error) than the losses of the updates
    either side, which fail as well: losses recorded otherwise throughout (scaled by their
    shares, summed over ranks) fail whatever the step, and that run fails by them all the same
    (model zoo run 301504, a tiny mixture of experts under bfloat16 whose losses were logged
    times their shares: a token's route at update 14, excused where the losses were right, was
    read `unexplained`). None where the loss moved at this update."""
    r = results[i]
    if r.loss_ok:
        return LOSS_WITHIN
    near = [*results[max(0, i - 1) : i], *results[i + 1 : i + 2]]
    if len(near) < 2 or not r.loss_judged or any(n.loss_ok or not n.loss_judged for n in near):
        return None
    low, high = min(n.loss_error for n in near), max(n.loss_error for n in near)
    if low - r.loss_allowed <= r.loss_error <= high + r.loss_allowed:
        return LOSS_AS_AROUND
    return None
