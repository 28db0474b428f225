"""A divergence that starts at a kink crossed in one run and not the other (judge/kinks.py says
what a kink leaves, and excuses the jumps that stay isolated or are the baseline's kind).

Under an adaptive optimizer or momentum, the steps taken with the jumped gradient move that
unit's weights by a share of a step, and from then on the two runs follow neighbouring
trajectories, not one trajectory and its rounding (`follow_kink_divergence`).

- **The kink.** The first update that fails has the kink's signature: no bookkeeping problem,
  the loss and every earlier update within noise, the worst gradient's error in at most
  `KINK_UNITS` rows and `JUMP_ROWS` of its rows, the rest of that gradient within factor times
  what its check allows (without a sketch estimator's bound, which grows with the error, and at
  most factor times its own noise there and one rounding, `divergence_start._rest_allowed`: not
  noise pooled from a parting still to come), or off by at most 1/ECHO of the share of
  themselves the units are off by (a unit crossing its kink leaves the others at rounding, or,
  behind a norm, at a far smaller share of themselves; a bug whose error sits where the
  gradient's energy sits, one column of a first layer fed an unnormalized input feature, one
  embedding row of a padding token, is as concentrated and about as far off all over the rest:
  `tests/test_kink_lookalikes.py`), and the step taken with it left the rounding: some weight
  failed, or stood over factor times its noise and factor times further than the update before,
  passing by what a drift allows (`kinks.stepped`; model zoo run 7155, an encoder under Adam,
  K=4, 100 updates: the kink's row stepped 14.9x its noise at update 83 and no weight failed
  until kinks crossed at updates 89 to 93 had failed the gradients). Else it is an isolated jump
  or none. Or the kink passed, by what a drift carried or the noise pooled from the updates
  around allowed there, and the first failure is its step: the weights fail, with no gradient,
  at the update whose gradient furthest over its noise (factor times at least) holds its error
  in a few units, or at the update after one, or up to REACH updates after a jump excused as
  isolated (`divergence_start.kink_before`); followed from the kink's update.
- **A choice made per input.** Or every failing gradient of the first failing update holds one
  input's share (`choices.every_one_input`: a token routed to another expert, an argmax), the
  model's gradient neither scaled nor turned beyond CHOICE_COSINE, and the step taken with it
  left the rounding: the runs part there as at a kink, and are followed the same way at the
  choice's size (`divergence_start.choice`). A choice moves the loss by a jump, where a kink
  moves it smoothly: its loss may stand off with it, by at most the choice's share of itself,
  where every check of the update before passed (model zoo run 296273, transformers' Mixtral
  at width 2 under Adamax, K=8: a token's route at update 15, the loss 1.08 times its allowed
  error off, layer 0's query weight 1.31 times, one input's share). Model zoo runs 222212
  and 222022 (a mixture of experts at width 3 under float16 and width 2 under bfloat16,
  Adagrad K=8 and Adafactor K=2): a token moved between two experts at update 8 (13), their
  gradients 12% to 14% (23%) off and every weight's step out of its noise; followed at 0.14
  (0.23), they pass, where they failed `unexplained`. An expert's gradient is a small sum of
  tokens' shares, so a choice's size is large: one of a quarter of its gradient or more
  (factor·J >= 1) is not followed, and the run fails as before, the `unexplained` message
  saying where the runs parted (judge/stepped_choice.py).
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
  with it) is raised to its size from there (`later_events.later_kink`; model zoo run 753: 0.57% at
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

from ..runs.model import Run
from .distributed import listed
from .divergence_start import choice, kink_before, kinked
from .kink_evidence import Pair, Sketched, apart
from .kinks import excuse, first_failing, most_pass, stepped, whole_model_moved
from .later_events import later_choice, later_kink
from .metrics import TensorDiff, module_of
from .results import UpdateResult
from .views import Sketching, full_rerun


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
    if at.problems or not (failing or moved) or not stepped(at, prior, factor):
        return []
    # a loss off at once with them: a choice's jump, read only where the update before passed
    jumped_loss = not at.loss_ok
    if jumped_loss and (prior is None or not prior.ok or not at.loss_judged):
        return []
    u = at.update
    grads = apart(merged, ref, "grads", u, seen)
    if jumped_loss and grads is None:
        return []
    worst, units = (None, None) if grads is None else kinked(at, grads, factor)
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
    chose = None if rows is not None or grads is None else choice(at, grads, factor)
    if jumped_loss and chose is None:
        return []  # a kink moves the loss smoothly, by no jump
    if chose is not None:  # a choice made per input where no kink's few rows hold the jump
        worst = chose
        jumped = f"jumped to {worst.ratio:.3g}x its allowed error"
    elif rows is None:  # no kink failed: did one pass, here or just before, and its step fail?
        found = kink_before(results, first, merged, ref, factor, seen)
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
    loss = "the loss and every earlier update within noise"
    if jumped_loss:  # one input's share of the loss at most, as of the gradients
        if not at.loss_error <= j_grads * abs(at.base_loss):
            return []
        loss = (
            f"every earlier update within noise and the loss {at.loss_error:.3g} off "
            f"({at.loss_ratio:.3g}x its allowed error: a choice moves the loss by a jump)"
        )
        at.loss_allowed = at.loss_error
    start = f"update {u - 1}" if u else "the start"
    where = f"{grads.holding(worst.name)} in {rows} row(s) or column(s)"
    cause, what = "an activation crossed its kink in one run and not the other", "kink"
    if chose is not None:
        what = "choice"
        where = f"one input's share (rank one{grads.rank_read(worst.name)})"
        cause = (
            "a choice made per input (a token routed to another expert, an argmax) went one "
            "way in one run and the other way in the other"
        )
    notes = [
        f"update {u}: the gradient of {worst.name} {jumped}, {where}{later}, {loss}: {cause}, "
        "and the runs follow neighbouring trajectories from there. "
        f"{widening(u, factor, j_grads, j_weights, start)} (the {what}'s size at that update)"
    ]
    followed = Followed(at, grads, since, j_grads, j_weights, start)
    return notes + follow_from(results[first:], followed, merged, ref, factor, seen)


def widening(u: int, factor: float, j_grads: float, j_weights: float, start: str) -> str:
    """The sentence that says how far a divergence followed from update `u` widens."""
    return (
        f"From update {u} on, each gradient may also differ by {factor:g} x {j_grads:.3g} of its "
        f"norm and each weight by {factor:g} x {j_weights:.3g} of how far it moved since {start}"
    )


@dataclasses.dataclass
class Followed:
    """Where a divergence is followed from and at what size: the first update it widens, its
    gradients read (`apart`), the update whose weights it measures the distance moved from
    (`since`), its shares of the gradients' norms and of the weights' distance, and how the
    notes name its start."""

    at: UpdateResult
    grads: Pair
    since: int
    j_grads: float
    j_weights: float
    start: str


def follow_from(
    results: list[UpdateResult],
    followed: Followed,
    merged: Run,
    ref: Run,
    factor: float,
    seen: Sketching | None,
) -> list[str]:
    """Widen `results` (from the divergence's first update on) by its size, raised where later
    kinks or the parted runs' own gradients stand further off, and excuse the updates the
    parted runs explain (module docstring); the notes after the first."""
    at, grads, since, start = followed.at, followed.grads, followed.since, followed.start
    j_grads, j_weights = followed.j_grads, followed.j_weights
    notes: list[str] = []
    parted = []  # updates whose failures the parted runs explain
    raised = 0.0  # the size followed, where they raised it
    grew: list[tuple[int, float]] = []  # passing updates that raised it, and to what
    for r in results:  # the divergence's own update read by its caller
        g_now = grads if r is at else apart(merged, ref, "grads", r.update, seen)
        w_now = apart(merged, ref, "weights", r.update, seen, since)
        later = None if r is at or g_now is None else later_kink(g_now, j_grads)
        if later is not None and factor * later[1] < 1:
            j_grads, j_weights = later[1], max(j_weights, later[1])  # a share steps a share
            notes.append(
                f"update {r.update}: another kink crossed, the gradient of {later[0]} "
                f"{j_grads:.3g} of its norm off, {later[2]}. "
                f"{widening(r.update, factor, j_grads, j_weights, start)}"
            )
        if g_now is not None:
            unwidened = list(r.grads)
            r.grads[:] = _widened(unwidened, factor * j_grads, g_now)
            chose = None if r is at else later_choice(r, g_now, factor, j_grads)
            if chose is not None:  # its share steps a share, as a kink's
                j_grads, j_weights = chose[1], max(j_weights, chose[1])
                notes.append(
                    f"update {r.update}: another choice made per input went otherwise, the "
                    f"gradients of {listed(chose[0], 4)} each one input's share, up to "
                    f"{j_grads:.3g} of their norm off, the model's gradient as a whole neither "
                    f"scaled nor turned. {widening(r.update, factor, j_grads, j_weights, start)}"
                )
                r.grads[:] = _widened(unwidened, factor * j_grads, g_now)
        if w_now is not None:
            r.weights[:] = _widened(r.weights, factor * j_weights, w_now)
        r.followed_share = max(r.followed_share, j_grads)
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
        f"{largest:.3g} of their norm off, as neighbouring trajectories part (where a kink "
        "parted them, units flip at more inputs). From the update after each, each gradient "
        f"may differ by {factor:g} x the share it stood off and each weight as much of how far "
        f"it moved since {start} (up to {factor:g} x {largest:.3g}); a bug must stand beyond "
        "that"
    ]


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


def _widened(diffs: list[TensorDiff], extra: float, pair: Pair) -> list[TensorDiff]:
    """Each diff with extra·||ref|| (or extra·||ref − before||, `pair.scale`) added to what it
    allows."""
    out = []
    for d in diffs:
        if pair.scalable(d.name):
            d = dataclasses.replace(d, allowed=d.allowed + extra * pair.scale(d.name))
        out.append(d)
    return out
