"""Where a divergence followed at a kink's size starts (judge/kink_divergence.py follows it): the
first failing update's kink (`kinked`: the gradient whose error a few units hold), a choice made
per input there (`choice`: every failing gradient one input's share), or a kink that passed just
before, whose step failed the weights (`kink_before`)."""

from __future__ import annotations

from collections.abc import Callable

from ..runs.model import Run
from .choices import CHOICE_COSINE, every_one_input
from .kink_evidence import Pair, Sketched, apart
from .kink_shape import Units, many_units
from .kinks import most_pass, whole_model_moved
from .metrics import TensorDiff
from .results import UpdateResult
from .views import Sketching

# updates a momentum of 0.9 (SGD's usual, Adam's beta1) carries a gradient in its steps: 1/(1 - 0.9)
REACH = 10


def choice(at: UpdateResult, grads: Pair, factor: float) -> TensorDiff | None:
    """The gradient furthest over what was allowed where every failing gradient of update `at`
    holds one input's share (`choices.every_one_input`: a token routed to another expert) and
    the model's gradient as a whole is neither scaled nor turned beyond what parted choices
    turn it (CHOICE_COSINE), while its passing gradients hold at least as many elements as the
    failing ones (`kinks.most_pass`): a token's route moves the experts it leaves and joins and
    the router, where a sample's share gained or lost (counted twice, left out) moves every
    layer it passes through. None otherwise, or without a reference (as `choices.anchors`)."""
    if not any(d.noise for d in at.grads):
        return None  # without a reference: measured against the baseline, which reads none
    if whole_model_moved(at, CHOICE_COSINE) or not most_pass(at):
        return None
    read = every_one_input(at, grads, factor)
    if read is None:
        return None
    return max((d for d in at.grads if d.name in read[0] and not d.ok), key=lambda d: d.ratio)


def kinked(at: UpdateResult, grads: Pair, factor: float) -> tuple[TensorDiff | None, Units | None]:
    """The gradient a kink at update `at` would have jumped in (of many rows), with the units
    that hold its error (None where none do): the failing one
    furthest over what was allowed; where the runs were seen through sketches, the one furthest
    over its noise among those over `factor` times it, failing or not. A sketched tensor's
    allowance holds the estimator's bound, widest for an error in few rows: model zoo run 62 at
    width 4 (a convolution's row 3.1e4x its noise, allowed 0.4 of its error, the embedding
    upstream of it furthest over what was allowed), and run 415 at width 4 over 40 updates (a
    GPT's feed-forward weight 131x its noise in one column passed, its biases failed).
    Without a reference no gradient has a noise: the failing one furthest over what was
    allowed, sketched or not. Either way, of those whose error a kink's few units hold where
    any does: the tensors upstream of a kink behind a norm may stand further over, spread (a
    ResNet's ReLU after a block's sum crossed its kink: 95% of the embedding's error in one
    row, the convolutions behind the block's GroupNorm further over the fixed tolerance, model
    zoo run 60020 at width 4 under Adagrad; sketched, run 63012 under AdamW: the kinked
    convolution's row 91x its noise, the one before its GroupNorm 104x, spread)."""
    if isinstance(grads, Sketched) and any(d.noise for d in at.grads):
        over = [d for d in at.grads if d.noise and d.error > factor * d.noise and d.name in grads]
        many = [d for d in over if many_units(grads.shape(d.name))]
        return _kink_in(many, grads, factor, lambda d: d.error / d.noise)
    many = [d for d in at.grads if not d.ok and many_units(grads.shape(d.name))]
    return _kink_in(many, grads, factor, lambda d: d.ratio)


def _kink_in(
    diffs: list[TensorDiff], grads: Pair, factor: float, key: Callable[[TensorDiff], float]
) -> tuple[TensorDiff | None, Units | None]:
    """Of `diffs`, the furthest by `key` of those whose error a kink's few units hold (the rest
    within what is allowed), with those units; where none do, the furthest of all, and None."""
    held = []
    for d in diffs:
        units = grads.kinked_units(d.name, rest=factor * _rest_allowed(d, factor))
        if units is not None:
            held.append((d, units))
    if held:
        return max(held, key=lambda pair: key(pair[0]))
    return max(diffs, key=key, default=None), None


def _rest_allowed(d: TensorDiff, factor: float) -> float:
    """What the rest of a kinked gradient may stand off by, before the factor `_kink_in` gives
    it: what its check allows, at most factor times its own noise at that update (and one
    rounding of it): a kink leaves the rest at rounding. The noise pooled from the updates
    around (noise.pool_noise) may hold a parting still to come: model zoo run 194702 (a ResNet
    in float32, gradients summed in bfloat16 from update 2, 0.4% off, 10^4 times their noise;
    its baseline parted from the reference at update 4) had a 16-element GroupNorm weight read
    as kinked, the other 15 elements within an allowance pooled from update 4, and the
    divergence followed from there passed the bug."""
    if not d.noise:
        return d.unbounded
    return min(d.unbounded, factor * d.noise + (d.rounding or 0.0))


def kink_before(
    results: list[UpdateResult],
    first: int,
    merged: Run,
    ref: Run,
    factor: float,
    seen: Sketching | None,
) -> tuple[int, list[TensorDiff], TensorDiff, int] | None:
    """A kink crossed at the first failing update, where no gradient failed, or at the update
    before it, whose gradient passed by what was allowed there (a drift carried, or noise pooled
    from the updates around), its step failing the weights: that update's index, its gradients
    over `factor` times their noise, the worst of them (by error over noise, of many rows: the
    kink's, its error in at most KINK_UNITS units), and those units' count. Model zoo run 245
    at width 4 (an encoder under RMSprop): one unit's gradient 393x its noise at update 7
    passed, and the weights failed at update 8; run 378 at width 8 (an encoder under RMSprop,
    K=8): a unit's gradient 49x its noise at update 2 passed (0.21 of what was allowed) and
    the weights of that update failed.

    Further back, within REACH updates, the latest jump excused as isolated (its gradients so
    excused, the worst by what was allowed), if its few units hold it: a momentum carries a
    jump's gradient into the steps after it, and the weights it moves may fail only updates
    later (model zoo run 65023 at width 4, an encoder under Adam at lr 1e-3, K=2, 60 updates,
    no reference: a unit of layer 1 jumped 23.9x at update 44, its weights 0.70x, 0.99x and
    then 1.25x what was allowed at updates 45 to 47)."""
    if all(d.ok for d in results[first].weights):
        return None
    here = [first] if all(d.ok for d in results[first].grads) else []
    back = range(first - 2, max(first - 2 - REACH, -1), -1)
    for k in [*here, first - 1, *back]:
        near = k >= first - 1
        if k < 0:
            continue
        if near:
            jumped = [d for d in results[k].grads if d.noise and d.error > factor * d.noise]
        else:
            jumped = [d for d in results[k].grads if d.excused == "isolated jump"]
        grads = apart(merged, ref, "grads", results[k].update, seen) if jumped else None
        if grads is None:
            if near or not jumped:
                continue
            return None
        jumped = [d for d in jumped if d.name in grads]
        many = [d for d in jumped if many_units(grads.shape(d.name))]
        worst, units = _kink_in(  # as `kinked` reads it
            many, grads, factor, (lambda d: d.error / d.noise) if near else (lambda d: d.ratio)
        )
        if worst is not None and units is not None:
            return k, jumped, worst, len(units[1])
        if not near:
            return None  # the latest jump is not a kink's
    return None
