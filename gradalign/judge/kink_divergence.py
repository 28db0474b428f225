"""A divergence that starts at a kink crossed in one run and not the other (judge/kinks.py says
what a kink leaves, and excuses the jumps that stay isolated or are the baseline's kind).

Under an adaptive optimizer or momentum, the steps taken with the jumped gradient move that
unit's weights by a share of a step, and from then on the two runs follow neighbouring
trajectories, not one trajectory and its rounding (`follow_kink_divergence`).

- **The kink.** The first update that fails has the kink's signature: no bookkeeping problem, the
  loss and every earlier update within noise, the worst gradient's error in at most `KINK_UNITS`
  rows and `JUMP_ROWS` of its rows, the rest of that gradient within factor times what its check
  allows (without a sketch estimator's bound, which grows with the error, and at most factor
  times its own noise there and one rounding, `_rest_allowed`: not noise pooled from a parting
  still to come), or off by at most 1/ECHO of the share of themselves the units are off by (a
  unit crossing its kink leaves the others at rounding, or, behind a norm, at a far smaller
  share of themselves; a bug whose error sits where the gradient's energy sits, one column of a
  first layer fed an unnormalized input feature, one embedding row of a padding token, is as
  concentrated and about as far off all over the rest:
  `tests/test_kink_lookalikes.py`), and the step taken with it left the rounding: some weight
  failed, or stood over factor times its noise and factor times further than the update before,
  passing by what a drift allows (`kinks.stepped`; model zoo run 7155, an encoder under Adam, K=4,
  100 updates: the kink's row stepped 14.9x its noise at update 83 and no weight failed until
  kinks crossed at updates 89 to 93 had failed the gradients). Else it is an isolated jump or
  none. Or the kink passed, by what a drift carried or the noise pooled from the updates around
  allowed there, and the first failure is its step: the weights fail, with no gradient, at the
  update whose gradient furthest over its noise (factor times at least) holds its error in a few
  units, or at the update after one, or up to REACH updates after a jump excused as isolated
  (`_kink_before`); followed from the kink's update.
- **Its size**, as a share of the reference: J_g, the failing gradients' largest
  ||g_m − g_ref|| / ||g_ref||, and J_w, the larger of J_g (a gradient off by a share of itself
  steps off by about that share) and the failing weights' largest
  ||w_m − w_ref|| / ||w_ref − w_ref(before)||. From that update on, each gradient may also
  differ by factor·J_g·||g_ref|| and each weight by factor·J_w·||w_ref − w_ref(before)|| (the
  distance the reference moved since the update before the kink), and a note says so; a kink
  with factor·J_g ≥ 1 would leave the gradients unchecked and is not followed. Measured on the
  Transformer encoders of bench/model_zoo.py that crossed a kink (4 of about 170 runs, Adam,
  AdamW, Adamax, RAdam): later gradients stayed within 2.1 J_g.
- **Later kinks.** Runs parted at one kink cross others: a later update whose gradient is
  further off than J_g, that error in a few rows or columns, is another kink, and J_g (and J_w
  with it) is raised to its size from there (`_later_kink`; model zoo run 753: 0.57% at
  update 4, 1.66% at update 6, then 2.3% at update 9 failed).
- **Runs parted by many kinks.** As the runs part, the units of the layers that feed a kink
  flip at more inputs, and the error spreads over the rows of those that flipped before, and
  upstream of them: a later update's failures, each gradient off by less than all of itself,
  while its bookkeeping, its weights and the model's other gradients (at least as many
  elements as the failing ones) stay within the divergence followed, are the parted runs' own,
  excused with one note (`_excuse_parted`; model zoo runs 7305 and 7424, encoders under Adam
  over 100 updates: feed-forward layers 10% and 23% off, in 2 to 22 of their 48 rows; run
  1302 at width 8, an encoder under Adamax: layer 0's attention, norm and feed-forward and
  the embedding 0.4% to 3% off, the kink followed in layer 1; the rest within what was
  followed). The failures once had to lie in the modules the kinks were crossed in; in a wide
  model the divergence reaches the modules upstream of them. The runs part further as they
  go: from the update after such an update, the size followed is raised to the share its
  failing gradients stood off (`_largest_share`, while factor times it stays below 1). Model zoo
  runs 52030 and 60020 at width 4 (ResNets under GroupNorm, NAdam and Adagrad): gradients 0.5%
  off at the kink, 3% an update later and 9% to 20% twenty updates on, the weights following;
  held at the kink's size, they failed from update 4 and update 45. So does a passing update
  whose gradients stood further off than the size followed, to the largest share (`_grown`
  notes it): model zoo run 195403 (a ResNet, Adagrad, K=4, 40 updates, float32), kinks at
  updates 18 and 20 (1.1%), 3.9% apart at update 25, 8.2% at 27, failed there at 1.8x and
  at 6x by update 39. A bug must stand beyond factor times what the runs parted by: gradients
  summed in bfloat16 from update 24 of that run pass these numbers, as within a kink's size
  (their values name them: judge/below_noise.py `narrow_sums`).

An accumulation bug is not localized: it fails the update it starts at in every tensor its
windows touch (loss scaling, a lost micro-batch, a gradient not cleared differ by shares of 1/K
and more), and one that starts after a kink must still exceed factor·J_g in most of the
model's gradients. Where a run kept sketches, the shares are estimated from them and the units
from the gradients' unit sums (judge/kink_evidence.py); where it kept no unit sums for the
kinked tensor, a failure that could be a kink stays a failure and a note says what would tell
them apart.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

from ..runs.model import Run
from .kink_evidence import Pair, Sketched, apart
from .kink_shape import Units, many_units
from .kinks import excuse, first_failing, most_pass, stepped, whole_model_moved
from .metrics import TensorDiff, module_of
from .results import UpdateResult
from .views import Sketching, full_rerun

# updates a momentum of 0.9 (SGD's usual, Adam's beta1) carries a gradient in its steps: 1/(1 - 0.9)
REACH = 10


def follow_kink_divergence(
    results: list[UpdateResult], merged: Run, ref: Run, factor: float, seen: Sketching | None = None
) -> list[str]:
    """Widen the updates from a kink on by the kink's own size (module docstring); a note if
    the first failing update is one. `ref`: the reference, or the baseline where there is
    none; `seen`: the runs are seen through sketches."""
    first = first_failing(results)
    if first is None:
        return []
    at = results[first]
    failing = [d for d in at.grads if not d.ok]
    moved = [d for d in at.weights if not d.ok]
    prior = results[first - 1] if first else None
    if at.problems or not at.loss_ok or not (failing or moved) or not stepped(at, prior, factor):
        return []
    u = at.update
    grads = apart(merged, ref, "grads", u, seen)
    worst, units = (None, None) if grads is None else _kinked(at, grads, factor)
    if worst is not None and grads is not None and worst.name in grads.counted:
        return []  # no kink in it, nor anywhere else followed from it
    if failing and (grads is None or (worst is not None and not grads.readable(worst.name))):
        if factor * max(d.rel_l2 for d in failing) >= 1 or whole_model_moved(at):
            return []  # too large to be followed anyway, or not a kink's few rows
        return [
            f"update {u}: gradients failed while the loss and every earlier update stayed within "
            "noise, as when an activation crosses its kink in one run alone; telling a kink "
            "from a bug needs that update's full weights and gradients in both runs "
            f"({full_rerun(u)})"
        ]
    rows = None if units is None else len(units[1])
    jumped = "" if worst is None else f"jumped to {worst.ratio:.3g}x its allowed error"
    if worst is not None and isinstance(grads, Sketched) and worst.noise:
        jumped = f"jumped to {worst.error / worst.noise:.3g}x its noise"
    later = ""  # where the kink passed: the update its step failed
    left = u  # the update whose weights failed, as a share of the distance moved since the kink
    if rows is None:  # no kink failed: did one pass, here or just before, and its step fail?
        found = _kink_before(results, first, merged, ref, factor, seen)
        if found is None:
            return []
        first, failing, worst, rows = found
        failed_at, at = u, results[first]
        u = at.update
        grads = apart(merged, ref, "grads", u, seen)
        if grads is None:
            return []
        if worst.excused:  # an isolated jump, noted as such
            floor = "noise floor" if worst.noise else "allowed error"
            jumped = f"jumped to {worst.ratio:.3g}x its {floor} (an isolated jump, noted)"
        else:
            jumped = (
                f"jumped to {worst.error / worst.noise:.3g}x its noise (within what was allowed)"
            )
        later = f", its step failing the weights at update {failed_at}"
    since = u - 1 if u > 0 else -1  # the weights the kink's step started from
    weights = apart(merged, ref, "weights", left, seen, since)
    if weights is None:
        return []
    jumped_in = {d.name for d in failing} | {worst.name}  # the kink's own may pass, sketched
    j_grads = max(grads.share(name) for name in jumped_in)
    if factor * j_grads >= 1:  # a gradient allowed to differ by all of itself is not checked
        return []
    # a gradient off by a share of itself steps off by about that share
    shares = [weights.share(d.name) for d in moved]
    j_weights = max([j_grads, *shares])
    if not (math.isfinite(j_grads) and math.isfinite(j_weights)) or factor * j_weights >= 1:
        return []  # (a weight allowed to differ by all it moved is not checked either)
    start = f"update {u - 1}" if u else "the start"
    notes = [
        f"update {u}: the gradient of {worst.name} {jumped}, {grads.holding(worst.name)} in "
        f"{rows} row(s) or column(s){later}, the loss and every earlier update within noise: an "
        "activation crossed its kink in one run and not the other, and the runs follow "
        f"neighbouring trajectories from there. From update {u} on, each gradient may also "
        f"differ by {factor:g} x {j_grads:.3g} of its norm and each weight by {factor:g} x "
        f"{j_weights:.3g} of how far it moved since {start} (the kink's size at that update)"
    ]
    parted = []  # updates whose failures the parted runs explain
    raised = 0.0  # the size followed, where they raised it
    grew: list[tuple[int, float]] = []  # passing updates that raised it, and to what
    for r in results[first:]:  # the kink's own update read above
        g_now = grads if r is at else apart(merged, ref, "grads", r.update, seen)
        w_now = apart(merged, ref, "weights", r.update, seen, since)
        later = None if r is at or g_now is None else _later_kink(g_now, j_grads)
        if later is not None and factor * later[1] < 1:
            j_grads, j_weights = later[1], max(j_weights, later[1])  # a share steps a share
            notes.append(
                f"update {r.update}: another kink crossed, the gradient of {later[0]} "
                f"{j_grads:.3g} of its norm off, {g_now.holding(later[0])} in {later[2]} row(s) "
                f"or column(s). From update {r.update} on, each gradient may also differ by "
                f"{factor:g} x {j_grads:.3g} of its norm and each weight by {factor:g} x "
                f"{j_weights:.3g} of how far it moved since {start}"
            )
        if g_now is not None:
            r.grads[:] = _widened(r.grads, factor * j_grads, g_now)
        if w_now is not None:
            r.weights[:] = _widened(r.weights, factor * j_weights, w_now)
        confined = _confined(r)
        if confined:
            parted.append(r)
        passed = not confined and r.tensors_ok and not r.problems  # its loss: read after
        grown = _largest_share(r, g_now, failing=confined) if confined or passed else 0.0
        if grown > j_grads and factor * grown < 1:  # the runs part further: followed so
            j_grads, j_weights = grown, max(j_weights, grown)  # (a share steps a share)
            raised = j_grads
            if passed:
                grew.append((r.update, grown))
    return notes + _grown(grew, factor, start) + _excuse_parted(parted, factor, raised)


def _largest_share(r: UpdateResult, grads: Pair | None, failing: bool) -> float:
    """The largest share of itself a gradient of update `r` stood off: of those failing
    (`failing`: a parted update's), or of all (a passing one's)."""
    if grads is None:
        return 0.0
    shares = [grads.share(d.name) for d in r.grads if (not failing or not d.ok) and d.name in grads]
    return max((s for s in shares if math.isfinite(s)), default=0.0)


def _grown(grew: list[tuple[int, float]], factor: float, start: str) -> list[str]:
    """One note for the passing updates that raised the size followed (`grew`: each update and
    the share its gradients stood off), none where none did."""
    if not grew:
        return []
    updates = [u for u, _ in grew]
    at = f"update {updates[0]}" if len(updates) == 1 else f"updates {updates[0]} to {updates[-1]}"
    largest = max(share for _, share in grew)
    return [
        f"{at}: the runs parted further within the divergence followed, their gradients up to "
        f"{largest:.3g} of their norm off, as neighbouring trajectories part where units flip "
        f"at more inputs. From the update after each, each gradient may differ by {factor:g} x "
        f"the share it stood off and each weight as much of how far it moved since {start} (up "
        f"to {factor:g} x {largest:.3g}); a bug must stand beyond that"
    ]


def _kinked(at: UpdateResult, grads: Pair, factor: float) -> tuple[TensorDiff | None, Units | None]:
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


def _kink_before(
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
        worst, units = _kink_in(  # as `_kinked` reads it
            many, grads, factor, (lambda d: d.error / d.noise) if near else (lambda d: d.ratio)
        )
        if worst is not None and units is not None:
            return k, jumped, worst, len(units[1])
        if not near:
            return None  # the latest jump is not a kink's
    return None


def _confined(r: UpdateResult) -> bool:
    """Whether update `r`'s failures are gradients each off by less than all of itself, with its
    bookkeeping, its weights and the model's other gradients (at least as many elements as the
    failing ones) within what is allowed."""
    failing = [d for d in r.grads if not d.ok]
    if not failing or r.problems or not all(d.ok for d in r.weights):
        return False
    return all(d.rel_l2 < 1 for d in failing) and most_pass(r)


def _excuse_parted(parted: list[UpdateResult], factor: float, raised: float) -> list[str]:
    """Excuse the gradient failures of runs parted by kinks that leave most of the model's
    gradients within the divergence followed (module docstring); one note for all of them,
    which says to what size they `raised` the divergence followed (0: not raised)."""
    if not parted:
        return []
    failing = [d for r in parted for d in r.grads if not d.ok]
    for r in parted:
        excuse(r, {d.name for d in r.grads if not d.ok}, "parted")
    worst = max(failing, key=lambda d: d.ratio)
    updates = [r.update for r in parted]
    at = (
        f"update {updates[0]}"
        if len(updates) == 1
        else f"{len(updates)} updates from {updates[0]} to {updates[-1]}"
    )
    modules = ", ".join(sorted({module_of(d.name) for d in failing}))
    return [
        f"{at}: the gradients of {modules} stood up to "
        f"{max(d.rel_l2 for d in failing):.3g} of their norm off ({worst.ratio:.3g}x what the "
        "kinks followed allow, in "
        f"{worst.name}), while the model's other gradients (at least as many elements) and "
        "every weight stayed within the divergence followed: the runs have parted at the "
        "kinks, and units flip at more inputs as they go (a bug moves most of the model's "
        "gradients); not counted as failures"
        + (
            f". From the update after each, each gradient may differ by {factor:g} x the share "
            f"it stood off, and each weight as much of how far it moved (up to {factor:g} x "
            f"{raised:.3g})"
            if raised
            else ""
        )
    ]


def _later_kink(grads: Pair, followed: float) -> tuple[str, float, int] | None:
    """A kink crossed at a later update of a followed divergence: the gradient (of a tensor of
    many rows or columns) furthest off as a share of its norm, by more than the size followed so
    far, that error in a few rows or columns. A run whose trajectories parted at one kink
    crosses more, each a jump of its own (model zoo run 753, a Transformer encoder under Adam,
    K=8: 0.57% at update 4, then 1.66% in one other row at update 6, and update 9 off by 2.3% in
    two rows failed at 1.006x): the size followed is raised to it from there on. A bug is not in
    a few rows."""
    shares = {name: grads.share(name) for name in grads.names() if many_units(grads.shape(name))}
    worst = max(shares, key=lambda name: (shares[name], name), default=None)
    if worst is None or not shares[worst] > followed:
        return None
    units = grads.kinked_units(worst)
    return None if units is None else (worst, shares[worst], len(units[1]))


def _widened(diffs: list[TensorDiff], extra: float, pair: Pair) -> list[TensorDiff]:
    """Each diff with extra·||ref|| (or extra·||ref − before||, `pair.scale`) added to what it
    allows."""
    out = []
    for d in diffs:
        if pair.scalable(d.name):
            d = dataclasses.replace(d, allowed=d.allowed + extra * pair.scale(d.name))
        out.append(d)
    return out
