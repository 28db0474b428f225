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
"""

from __future__ import annotations

from .choices import every_one_input
from .distributed import listed
from .kink_evidence import apart
from .results import Comparison, UpdateResult
from .views import sketch_width


def one_input_shares(c: Comparison, r: UpdateResult) -> tuple[list[str], list[str]] | None:
    """Against a reference, where every failing gradient of update `r` holds one input's share
    of one input (rank one, or beside a weight holding one, failing or passing over its noise,
    the same input's: `choices.same_inputs`): those gradients, and the passing ones beside
    them. None otherwise (no reference, no failing gradient, or one of another shape)."""
    if c.reference is None or all(d.ok for d in r.grads):
        return None
    seen = sketch_width(c.baseline, c.merged, c.reference)  # as the comparison sees them
    grads = apart(c.merged, c.reference, "grads", r.update, seen)
    read = None if grads is None else every_one_input(r, grads, c.tolerances.noise_factor)
    return None if read is None else (sorted(read[0]), read[1])


def stepped_choice(c: Comparison, r: UpdateResult | None) -> str | None:
    """A clause for the `unexplained` message: at the first failing update `r` every failing
    gradient holds one input's share (`one_input_shares`) and some weight failed with it;
    None otherwise."""
    if r is None or r.problems:
        return None
    stepped = [d.name for d in r.weights if not d.ok]
    read = one_input_shares(c, r) if stepped else None
    if read is None:
        return None
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
