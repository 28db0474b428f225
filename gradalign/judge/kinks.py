"""A ReLU-like kink crossed in one run and not the other: an honest difference the noise floor
cannot see coming.

A unit whose pre-activation sits within rounding of a kink (ReLU's 0, a max-pool's tie) is
switched on in one run and off in the other. The forward barely changes (the activation is
continuous there), but the backward through that unit gains or loses one sample's
contribution: at that update, one row of the unit's weight (and its bias element) and one
column of the next layer's weight hold the whole gradient error, and every tensor upstream of
the unit follows. The baseline crosses kinks
against the reference too (measured: 2 in 300 updates of the default SGD run).

- **An isolated jump** (`excuse_isolated_jumps`): a gradient failure at a single update whose error
  sits in a few rows, the rest of its tensor within factor times what is allowed (or, the kink's
  echo behind a norm, off by 1/ECHO of the units' share of themselves), with the neighbouring
  updates, the weights and the loss all within noise (or the loss off by no more than the losses
  either side, where they stand off throughout: `loss_as_around`), is reported as a note, not a
  failure: `1 + updates // 100` such updates, and past them each further one in units (rows or
  columns) no jump excused before was held in. A wide model crosses kinks often (an encoder with 96
  ReLU units a layer, Adamax, K=4: one unit at updates 7 and 9 of 10, each another); a unit whose
  error comes back, each time stepped with, is an error that stays. A neighbour that is an excused
  jump counts as within noise: an update whose neighbour failed is read once more after the rest.
- **A quiet jump**: the same failure where its step left every weight within its noise (not
  `stepped`: no weight over factor times its noise and factor times further than the update
  before), at any update, in a row or not, the same unit or another: the training stays the
  same within rounding. Its tensors off by less than 1/factor of themselves (as a kink
  followed): a gradient off by all of itself is no sample's share of a unit. Under Adam one
  sample's share of one unit's gradient moves that unit's step by a sliver; a unit that
  hovers at its kink flips in one run at update after update (model zoo run 1252 at width 8,
  an encoder under Adam: unit 191 at updates 7, 8 and 9). A bug moves the weights (a
  localized one: a row that steps where it should not), and fails there.
- **Its echo**: in a wide model the tensors upstream of the unit fail beside it, each off by a
  smaller share of itself than the kinked tensor, spread (`_echoes`): excused with the jump
  (one unit of a 192-unit feed-forward 3.5e-4 off, the attention and embedding before it
  1.7e-4).
- **Quietly parted**: after such jumps, an update whose failures are spread (no unit's rows
  hold them) while its step left every weight within its noise, each failing gradient off by
  less than 1/factor of itself and the model's passing gradients at least as many elements:
  units that flipped before change the backward at more inputs (`_quietly_parted`; model zoo
  run 2002 at width 4, 40 updates). A bug moves most of the gradients. After a choice made per
  input (a jump of one input's share), each failing gradient off by less than all of itself,
  the whole turned by a cosine down to CHOICE_COSINE (judge/choices.py): a token's route
  moves a token's share of the small sums an expert's and a router's gradients are.
- **Jumps the baseline makes too** (judge/baseline_jumps.py): over a long run a
  model with many near-ties (a max over positions after a convolution) crosses kinks at many
  updates, some in a row. Where the baseline's own gradient jumped against the reference (its
  error over `JUMP_OUTLIER` times its median over the run, held in at most `JUMP_OWN_ROWS` rows
  and `JUMP_OWN_SHARE` of them), the merged run's gradient failures with the weights within
  noise are excused if there are at most factor times as many updates of them as of the
  baseline's, each only in tensors the baseline jumped in and in no more rows than its jumps
  needed; otherwise none is. Only the baseline and the reference say where and how a jump looks,
  so a bug in the merged run cannot widen this, and a bug fails its weights anyway.
- **A divergence that starts at a kink**, where the step taken with the jump leaves the
  rounding, is followed at the kink's size: judge/kink_divergence.py.

Without a reference the isolated jump and the followed divergence are measured against the
baseline instead (the fixed tolerances may not see the kink's step in the weights, so none is
required to have failed there): a Transformer encoder's ReLU feed-forward crossing a kink under
Adam was the last kind of false alarm of bench/model_zoo.py --reference-none (4 of 800 runs).
"""

from __future__ import annotations

import dataclasses
import math

from ..runs.model import Run
from .choices import (
    CHOICE_COSINE,
    CHOICES_PART,
    WHOLE_COSINE,
    anchors,
    limits,
    lone_beside_choice,
    lone_vectors,
    same_inputs,
)
from .jump_losses import loss_as_around
from .jump_note import jump_note
from .kink_evidence import Pair, apart
from .kink_shape import ONE_INPUT, held_in_many_rows
from .metrics import TensorDiff
from .results import UpdateResult
from .views import Sketching

KINKS_PART = "units that flipped before change the backward at more inputs"


def excuse_isolated_jumps(
    results: list[UpdateResult], merged: Run, ref: Run, factor: float, seen: Sketching | None = None
) -> list[str]:
    """Mark localized gradient jumps as excused, isolated ones or those whose step left the
    weights in their noise (module docstring); return a note for each. `seen`: the runs are
    seen through sketches (judge/kink_evidence.py reads them)."""
    notes: list[tuple[int, str]] = []  # each jump's note, by its update
    crossed, isolated = set(), 0  # the units (tensor, axis, index) jumps were in
    parted: list[UpdateResult] = []  # quiet updates after a jump, failing in a part of the model
    chose = False  # whether a jump excused so far was a choice made per input (one input's share)
    order, retried = list(range(len(results))), set()

    def later(i: int) -> None:
        """Read update i once more after the rest: its neighbours may be excused jumps by then
        (model zoo run 190345, a tiny mixture of experts under bfloat16, 20 updates: a token
        routed otherwise at update 15, its step leaving the noise, then at 16 to 19, quiet)."""
        if i not in retried:
            retried.add(i)
            order.append(i)

    for i in order:
        r = results[i]
        loss = loss_as_around(results, i)
        if not (gradients_alone_failed(r) and loss is not None):
            continue
        quiet = not stepped(r, results[i - 1] if i else None, factor)
        if not (quiet or _neighbours_pass(results, r.update)):
            later(i)
            continue
        grads = apart(merged, ref, "grads", r.update, seen)
        if grads is None:
            continue
        failing = [d for d in r.grads if not d.ok]
        found = {d.name: grads.jumped(d.name, factor * d.unbounded) for d in failing}
        kinked = {name: units for name, units in found.items() if units is not None}
        beside = {**anchors(r, grads, factor), **kinked}
        joined = same_inputs([name for name in found if name not in kinked], beside, grads)
        kinked.update(joined)
        echoes = [name for name in found if name not in kinked]
        unread: set[str] = set()
        if any(axis == ONE_INPUT for axis, _ in kinked.values()):  # a norm's scale: unread
            unread = lone_vectors(echoes, grads)
            echoes = [name for name in echoes if name not in unread]
        elif not kinked and quiet and lone_vectors(echoes, grads) == set(echoes):
            moved = whole_model_moved(r, CHOICE_COSINE)
            lone = None if moved else lone_beside_choice(r, set(echoes), beside, grads, loss)
            if lone is not None:  # only norms' scales failed, beside a choice passing
                chose = True
                excuse(r, set(found), "isolated jump")
                notes.append((r.update, lone))
                continue
        # echoes are measured against the jump's own weights (and those beside it), not the
        # tensors joined to it: a bias's share of itself says nothing of what is upstream
        if not kinked or (echoes and not _echoes(echoes, beside, grads)):
            if quiet and notes and _quietly_parted(r, grads, factor, chose):
                parted.append(r)
            continue
        # one sample's share of one unit among many, not a gradient off by all of itself (as a
        # kink followed) nor the model's gradient scaled or turned as a whole
        if quiet and not _a_units_share(r, kinked, grads, factor, beside):
            if not _neighbours_pass(results, r.update):
                later(i)
                continue
            quiet = False
        units = _units(kinked)
        if not quiet and isolated >= 1 + len(results) // 100 and units & crossed:
            continue  # past the first few stepped with, each jump in units of its own
        crossed |= units
        isolated += not quiet
        chose = chose or any(axis == ONE_INPUT for axis, _ in kinked.values())
        excuse(r, set(found), "isolated jump")
        notes.append((r.update, jump_note(r, kinked, joined, echoes, unread, quiet, grads, loss)))
    notes.sort(key=lambda pair: pair[0])
    texts = [text for _, text in notes]
    for r in parted:
        excuse(r, {d.name for d in r.grads if not d.ok}, "parted")
    if parted:
        updates = ", ".join(str(r.update) for r in parted)
        share, cause = ("all", CHOICES_PART) if chose else ("1/factor", KINKS_PART)
        texts.append(
            f"update(s) {updates}: after the jumps above, gradients failed in a part of the model "
            f"(each off by less than {share} of itself, the model's other gradients, at least as "
            "many elements, within noise) while the step left every weight within its noise: "
            f"{cause}; not counted as failures"
        )
    return texts


def _units(kinked: dict) -> set[tuple[str, int, int]]:
    """The units a jump is held in, (tensor, axis, index), that a later jump can be in again:
    a kink's rows or columns. One input's share is no such unit: the input is another at each
    update (each window holds other samples), so a choice made per input in an expert that one
    made before is one of its own. Model zoo run 212069 (a tiny mixture of experts under float16
    autocast, Adam 1e-2, K=4 uneven, 20 updates): tokens routed otherwise at updates 12 and 19
    (stepped with at 12), then at 18 through expert 1, whose weights' errors were 99.8% rank one
    and whose step the next update passed; held as expert 1's whole weight, the unit update 19's
    jump had been excused in, it failed at 2.6x, `unexplained`."""
    return {
        (name, axis, j) for name, (axis, held) in kinked.items() if axis != ONE_INPUT for j in held
    }


def _a_units_share(
    r: UpdateResult, kinked: dict, grads: Pair, factor: float, beside: dict | None = None
) -> bool:
    """Whether a quiet jump looks like one sample's share of a unit: some kinked tensor of many
    rows (in a tensor of one row, a 0-d scale or a bias, any error sits in "one unit"), each off
    by less than 1/factor of itself, and the model's gradient not scaled or turned as a whole
    (a loss 1.02 times too large, recorded apart from the step, is no kink). Where the jump is
    a choice made per input (one input's share), as `choices.limits` reads one: model zoo run 189586
    (a tiny mixture of experts under Adamax, bfloat16, K=4, 20 updates), a token moved from
    expert 2 to expert 3 at update 18, each expert's gradient 36% to 46% off and rank one, the
    model's gradient turned to a cosine of 0.9989, every weight within its noise."""
    choice = any(axis == ONE_INPUT for axis, _ in kinked.values())
    largest, cosine = limits(choice, factor)
    evidence = {**(beside or {}), **kinked}  # and the weights beside a choice's jump
    held = (held_in_many_rows(grads.shape(name), units) for name, units in evidence.items())
    if not any(held) or whole_model_moved(r, cosine):
        return False
    return max(grads.share(name) for name in kinked) < largest


def _quietly_parted(r: UpdateResult, grads: Pair, factor: float, after_choice: bool) -> bool:
    """Whether update `r`'s failing gradients, spread, are what kinks crossed before leave: each
    off by less than 1/factor of itself, the model's passing gradients at least as many
    elements, the model's gradient as a whole neither scaled nor turned (`whole_model_moved`).
    Model zoo run 2002 at width 4 (an encoder under Adam, 40 updates): after quiet jumps of
    units of layer 0 at updates 24 and 25, its feed-forward gradient stood 0.4% to 2% off at
    updates 26 and 36, spread over its rows, with every weight within its noise.

    After a choice made per input (`after_choice`: a jump excused as one input's share), each
    off by less than all of itself, and the whole turned by a cosine down to CHOICE_COSINE: a
    token's route moves a whole token's share of the experts it leaves and joins, and of the
    router, which are small sums of many such shares. Model zoo runs 186399 and 186459 (a
    tiny mixture of experts under bfloat16 autocast, RMSprop K=8 and Adam K=4): after a token
    routed otherwise at update 3 (and 2), other tokens' routes flipped at update 7 (and 9),
    every weight within its noise: expert 2's gradients 34% and 25% off, each 99.8% in two
    outer products (two tokens), and the router's bias 51% off; the model's gradient turned
    to a cosine of 0.9988 (and 0.9986), its scale within 0.4%."""
    largest, cosine = limits(after_choice, factor)
    if whole_model_moved(r, cosine):
        return False
    failing = [d for d in r.grads if not d.ok]
    return all(grads.share(d.name) < largest for d in failing) and most_pass(r)


def most_pass(r: UpdateResult) -> bool:
    """Whether update `r`'s passing gradients hold at least as many elements as its failing
    ones: runs parted at kinks differ in a part of the model, a bug moves most of it. A sketched
    gradient that passed only by its estimator's bound counts for neither (a gradient 1.5 times
    itself from update 6 on passed a sketched MLP as its biases' parted runs)."""
    passing = sum(d.size or 0 for d in r.grads if d.clearly_ok)
    return passing >= sum(d.size or 0 for d in r.grads if not d.ok)


def _echoes(echoes: list[str], kinked: dict, grads: Pair) -> bool:
    """Whether the failing tensors `echoes`, their errors spread, are what a kink in `kinked`
    sends upstream: some kinked tensor holds its error in a few of many rows, and each echo is
    off by a smaller share of itself than the furthest kinked one. A unit flipped for one
    sample changes the backward of every tensor before it by that sample's share: in a wide
    encoder (192 units a layer) one unit of layer 0's feed-forward, 3.5e-4 of linear1's
    gradient off in one row, put the attention and the embedding 1.7e-4 off, beyond their
    noise. A bug moves every tensor by like shares, spread in all of them."""
    if not any(held_in_many_rows(grads.shape(name), units) for name, units in kinked.items()):
        return False
    furthest = max(grads.share(name) for name in kinked)
    return all(grads.share(name) < furthest for name in echoes)


def stepped(at: UpdateResult, prior: UpdateResult | None, factor: float) -> bool:
    """Whether the step taken with the jumped gradient left the rounding: some weight failed,
    or stood over `factor` times its noise and `factor` times further than the update before
    (a weight that passes by what a drift or a spread allows: under Adam the kink's own row
    stepped 14.9x its noise at model zoo run 7155's update 83 and stayed far within what was
    allowed). A gradient that jumped but was not stepped with (recorded apart from the step)
    leaves the weights in their noise. Without a noise (no reference) any jump counts: the
    fixed tolerances may not see one step."""
    if any(not d.ok for d in at.weights):
        return True
    before = {d.name: _over_noise(d) for d in prior.weights} if prior is not None else {}
    ratios = [(d.name, _over_noise(d)) for d in at.weights]
    if all(ratio is None for _, ratio in ratios):
        return True
    return any(
        ratio is not None and ratio > factor * max(1.0, before.get(name) or 0.0)
        for name, ratio in ratios
    )


def _over_noise(d: TensorDiff) -> float | None:
    """A tensor's error over its noise, where it has one."""
    return d.error / d.noise if d.noise and math.isfinite(d.noise) else None


def whole_model_moved(r: UpdateResult, least_cosine: float = WHOLE_COSINE) -> bool:
    """Whether the model's gradient as a whole is scaled or turned (its least-squares ratio
    more than 1% from 1, or its cosine below `least_cosine` beyond what the runs' own rounding
    turns it, `noise_turn`): a kink moves a few rows of a tensor, which leave the whole nearly
    as it was. A golden's summaries carry no per-tensor share (NaN), and a loss scaled K times
    was said to be as when an activation crosses its kink."""
    ratio, cosine = r.grad_ratio, r.grad_cosine
    if ratio is None or cosine is None or not (math.isfinite(ratio) and math.isfinite(cosine)):
        return False
    return abs(ratio - 1) > 0.01 or 1 - cosine > (1 - least_cosine) + noise_turn(r)


def noise_turn(r: UpdateResult) -> float:
    """How far below 1 the rounding alone puts the cosine of the two runs' gradients at update
    `r`: Σ noise² / Σ ||g||² over the gradients with a noise (the baseline's own error against
    the reference), the 1 − cos that independent errors of the baseline's size in both runs
    leave, (||e_b||² + ||e_m||²) / 2||g||². In float32 a sliver (1e-12 here); in 16 bits the
    cosine itself: model zoo run 198067 (a text CNN under bfloat16 autocast, Adafactor, K=2, 60
    updates) turned its clean gradients 0.0006 to 0.0065 from each other at every update, where
    this is 0.002 to 0.02 (clean runs of the zoo in bfloat16 and float16, 30 updates: the
    turn over this, median 0.19, 90th percentile 0.43 to 0.50, over 1 only where the runs had
    parted at kinks). Without a reference there is none: 0."""
    noise = math.fsum(d.noise**2 for d in r.grads if d.noise and math.isfinite(d.noise))
    scale = math.fsum(d.norm**2 for d in r.grads if d.norm and math.isfinite(d.norm))
    return noise / scale if scale > 0 else 0.0


def gradients_alone_failed(r: UpdateResult) -> bool:
    """Whether some gradient of update `r` failed while its weights passed and its bookkeeping
    held (what a kink crossed in one run leaves)."""
    return any(not d.ok for d in r.grads) and all(d.ok for d in r.weights) and not r.problems


def excuse(r: UpdateResult, names: set[str], reason: str) -> None:
    """Mark the gradients `names` of update `r` as excused, for `reason`."""
    r.grads[:] = [dataclasses.replace(d, excused=reason) if d.name in names else d for d in r.grads]


def _neighbours_pass(results: list[UpdateResult], update: int) -> bool:
    """Whether the updates either side of `update` pass their gradients and weights: a jump
    whose step failed the next update's weights started a divergence, which is followed
    (judge/kink_divergence.py), not excused (a wide encoder's kink at update 4 stepped a weight
    61x its noise and failed update 5's weights; excused, the divergence went unfollowed)."""
    near = [r for r in results if abs(r.update - update) == 1]
    return all(all(d.ok for d in (*r.grads, *r.weights)) for r in near)


def first_failing(results: list[UpdateResult]) -> int | None:
    """The index of the first update that fails, if any."""
    return next((i for i, r in enumerate(results) if not r.ok), None)
