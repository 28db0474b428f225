"""A choice made per input that went otherwise in one run and was stepped with at once, read for
the `unexplained` message against a reference.

A token routed to another expert (an argmax, a tie) moves its share of the experts it leaves
and joins and of the router: each of those gradients is off by one input's share, rank one and
of the same input (judge/choices.py reads it so). Where the step taken with that gradient left
the rounding at once (a weight failed at the same update), the kink diagnoses do not excuse the
jump, and where each gradient stands off by more than 1/factor of itself, a followed divergence
would allow every later gradient as much and check nothing (judge/kink_divergence.py): the run
fails. Model zoo runs 189658 (Adafactor) and 191929 (Adadelta at K=48, at its last update), a
tiny mixture of experts under bfloat16: every failing gradient one input's share, the router's
bias stepped out of its noise. What the message can say is where the runs parted and why it
cannot follow them from there; a float64 rerun of the merged run routes as the reference does
and tells the two apart. One input's share lost or weighted otherwise (a micro-batch of one
sample) reads alike, which the message says too.

In float32 the token's changed output and backward fail every layer they pass through too, by
far smaller shares of themselves (`choices.routed`): the message names the route and its
echoes, and the float64 rerun tells the two apart as before.
"""

from __future__ import annotations

from .choices import ROUTE_GAP, Route, every_one_input, routed
from .distributed import listed
from .kink_evidence import Pair, apart
from .kink_shape import WHOLE
from .results import Comparison, UpdateResult
from .views import sketch_width


def one_input_shares(c: Comparison, r: UpdateResult) -> tuple[list[str], list[str]] | None:
    """Against a reference, where every failing gradient of update `r` holds one input's share
    of one input (rank one, or beside a weight holding one, failing or passing over its noise,
    the same input's: `choices.same_inputs`): those gradients, and the passing ones beside
    them. None otherwise (no reference, no failing gradient, or one of another shape)."""
    grads = _grads_apart(c, r)
    read = None if grads is None else every_one_input(r, grads, c.tolerances.noise_factor)
    return None if read is None else (sorted(read[0]), read[1])


def _grads_apart(c: Comparison, r: UpdateResult) -> Pair | None:
    """The merged run's gradients and the reference's at update `r`, as the comparison sees
    them (sketched or whole); None without a reference, where none failed, or none is kept."""
    if c.reference is None or all(d.ok for d in r.grads):
        return None
    seen = sketch_width(c.baseline, c.merged, c.reference)
    return apart(c.merged, c.reference, "grads", r.update, seen)


def stepped_choice(c: Comparison, r: UpdateResult | None) -> str | None:
    """A clause for the `unexplained` message: at the first failing update `r` every failing
    gradient holds one input's share (`one_input_shares`) and some weight failed with it, or a
    token's route stands out of what it echoes into (`route_clause`); None otherwise."""
    if r is None or r.problems:
        return None
    stepped = [d.name for d in r.weights if not d.ok]
    read = one_input_shares(c, r) if stepped else None
    if read is None:
        return route_clause(c, r)
    shares, held = read
    also = f", beside passing {listed(held, 2)} holding the same" if held else ""
    return (
        f"at update {r.update} every failing gradient holds one input's share "
        f"({listed(shares, 4)}, each of the same input{also}), and the step taken with "
        f"it failed {listed(stepped, 3)} at once: the shape of a choice made per input (a token "
        "routed to another expert, an argmax) that went otherwise in one run, from where the "
        "runs part by more than the reference follows, or of one input's share lost or "
        "weighted otherwise (a micro-batch of one sample)"
    )


def route_clause(c: Comparison, r: UpdateResult) -> str | None:
    """The clause for a token's route seen with its echoes at update `r` (`choices.routed`),
    against a reference; None where none is read."""
    grads = _grads_apart(c, r)
    route = None if grads is None else routed(r, grads, c.tolerances.noise_factor)
    if route is None:
        return None
    shown = [f"{name}{_slabs(route, name)}" for name in sorted(route.held)]
    beside = f", beside {listed(route.vectors, 2)}" if route.vectors else ""
    return (
        f"at update {r.update} the failing gradients furthest off hold one input's share "
        f"({listed(shown, 4)}{beside}), and every other failing gradient stands off by a "
        f"share of itself {route.gap:.3g} times smaller at least ({len(route.echoes)} of them, "
        f"the most {route.echo_share:.3g} in {route.echoes[0]}; {ROUTE_GAP} times or more "
        "reads so): the shape of a token routed to another expert in one run, whose changed "
        "output and backward move every layer they pass through by that token's share, from "
        "where the runs part by more than the reference follows"
    )


def _slabs(route: Route, name: str) -> str:
    """Where a held tensor was read by slabs of its first axis: which ones."""
    held = route.held[name][1]
    return "" if held == WHOLE else f" in slabs {sorted(held)} of its first axis"
