"""Events at a later update of a divergence followed from a kink or a choice
(judge/kink_divergence.py): runs parted at one cross more kinks, and choose otherwise at more
inputs, as they go; each is read as at the divergence's first update, and the size followed is
raised to its own from there."""

from __future__ import annotations

import math

from .divergence_start import choice
from .kink_evidence import Pair
from .kink_shape import many_units
from .results import UpdateResult

UNIT_MAJORITY = 0.5  # a kinked unit behind a norm holds more than this share of its row's error


def later_kink(grads: Pair, followed: float) -> tuple[str, float, str] | None:
    """A kink crossed at a later update of a followed divergence: the gradient (of a tensor of
    many rows or columns) furthest off as a share of its norm, by more than the size followed so
    far, that error in a few rows or columns. A run whose trajectories parted at one kink
    crosses more, each a jump of its own (model zoo run 753, a Transformer encoder under Adam,
    K=8: 0.57% at update 4, then 1.66% in one other row at update 6, and update 9 off by 2.3% in
    two rows failed at 1.006x): the size followed is raised to it from there on. A bug is not in
    a few rows. A gradient off by all of itself or more is no kink's share, and not read: an
    attention key bias, whose exact gradient is 0, stood 4e8 times its reference's norm off
    and hid the kinks of model zoo run 291208 (an OPT under transformers' Adafactor, K=3:
    0.58% and 0.75% in one row of layer 1's fc1 at updates 15 and 16)."""
    shares = {name: grads.share(name) for name in grads.names() if many_units(grads.shape(name))}
    shares = {name: share for name, share in shares.items() if share < 1}  # not all of itself
    worst = max(shares, key=lambda name: (shares[name], name), default=None)
    if worst is None or not shares[worst] > followed:
        return None
    units = grads.kinked_units(worst)
    if units is not None:
        where = f"{grads.holding(worst)} in {len(units[1])} row(s) or column(s)"
        return worst, shares[worst], where
    echoed = _echoed_unit(grads, worst, shares, followed)
    if echoed is None:
        return None
    where = (
        f"most of it in row {min(echoed[1])}, the rest in other rows (a norm's group's echo); "
        f"{echoed[0]}'s gradient holds {grads.holding(echoed[0])} in that same row"
    )
    return worst, shares[worst], where


def _echoed_unit(
    grads: Pair, worst: str, shares: dict[str, float], followed: float
) -> tuple[str, frozenset[int]] | None:
    """The kinked unit of a gradient behind a norm over groups of units (GroupNorm between a
    conv and its ReLU): more than UNIT_MAJORITY of its error in the unit's row, the rest the
    group's echo (the norm hands each unit of the group a share of one unit's change), where
    another gradient of as many rows, itself off by more than the size followed, holds a kink's
    share in the same row (the norm's own weight or bias, read per unit). Model zoo run 303012
    (a ResNet under GroupNorm, RMSprop, K=6): parted at a kink at update 11 (0.08%), at update
    15 block 1's first conv stood 1.15% off, 83.5% of it in one output channel and the rest in
    the three others of its group of four, the norm's bias 0.63% off, all of it in the same
    channel; read as no kink, it failed 3.6 times allowed and was named `token-normalization`.
    A bug is not in one unit of two tensors. The other gradient and the unit's row; None where
    there is none."""
    rows = grads.shape(worst)[0]  # a tensor of many units (`later_kink`): one axis at least
    top = grads.units(worst, most=1, of_rows=1.0, held=UNIT_MAJORITY)
    if top is None or top[0] != 0:
        return None
    for name in sorted(shares):
        shape = grads.shape(name)
        if name == worst or not shares[name] > followed or not shape or shape[0] != rows:
            continue
        if grads.kinked_units(name) == top:
            return name, top[1]
    return None


def later_choice(
    r: UpdateResult, grads: Pair, factor: float, followed: float
) -> tuple[list[str], float] | None:
    """A choice made per input that went otherwise at a later update of a followed divergence,
    read as at its first update (`divergence_start.choice`): every gradient still failing
    within the size followed holds one input's share, the model's gradient as a whole neither
    scaled nor turned beyond CHOICE_COSINE, most of its elements passing. The failing
    gradients and their largest share of their norm, where it stands beyond the size followed
    and factor times it below 1; None otherwise. Runs parted at a kink choose otherwise at more
    inputs as they go: model zoo run 291206 (an OPT under transformers' Adafactor, K=2,
    micro-batches of 42 and 6 samples) crossed a kink at update 7 (0.41% of layer 1's fc1
    bias), and at update 9 eight gradients of both layers stood 1.9% to 3.7% off, each one
    token's share (rank one), the model's gradient 1.00004 of the reference's; read as a kink
    only, it failed `unexplained`. A bug moves every input's share (a loss scaled, a
    micro-batch lost or counted twice moves the model's gradient as a whole)."""
    worst = choice(r, grads, factor)
    if worst is None:
        return None
    failing = sorted(d.name for d in r.grads if not d.ok and d.name in grads)
    share = max(grads.share(name) for name in failing)
    if not (math.isfinite(share) and share > followed and factor * share < 1):
        return None
    return failing, share
