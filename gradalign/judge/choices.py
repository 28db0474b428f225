"""A choice made per input (a token routed to another expert, an argmax, a tie) that went one way
in one run and the other way in the other, as the kink diagnoses read it (judge/kinks.py): what
else holds the same input's share at its jump (`same_inputs`), and how far a quiet jump and the
runs parted after one may stand off (`limits`). One input's share moves the small sums an
expert's and a router's gradients are by a share of themselves, where a ReLU unit's kink moves
one sample's share of one unit among many."""

from __future__ import annotations

from .kink_evidence import Pair
from .kink_shape import ONE_INPUT, WHOLE, Units
from .metrics import module_of
from .results import UpdateResult

WHOLE_COSINE = 0.999  # a model's gradient turned below this cosine moved as a whole ...
CHOICE_COSINE = 0.99  # ... or below this one, where the runs parted at a choice made per input
CHOICES_PART = (
    "a choice made per input that went otherwise before (a token's route) parts the runs, and "
    "more inputs' choices go otherwise as they part (the gradient as a whole within its scale "
    f"and turned by a cosine of {CHOICE_COSINE} at most)"
)


def same_inputs(names: list[str], kinked: dict, grads: Pair) -> dict[str, Units]:
    """Of `names`, beside a jump whose weights hold one input's share (kinked so, whole), the
    tensors that hold the same: a weight of few rows or columns whose error is one input's share
    too and of the same input as one of those (a router's, one row per expert, reading the
    token the experts read: `Pair.same_input`), and a bias whose error lies along a weight's of
    its module (`Pair.along_input`: one input's share of a bias is that input's δ_s whole).
    Model zoo runs 189608 and 189706 (a tiny mixture of experts under bfloat16): a token routed
    otherwise at update 19 (and 12), the experts' weights 99.6% to 99.9% rank one, their biases
    97% to 99.9% along them and up to 27% off, the router's weight 99% rank one, its input the
    experts' (0.996), and its bias 98% along it, 48% off."""
    held = [name for name, units in kinked.items() if units == (ONE_INPUT, WHOLE)]
    if not held:
        return {}
    joined = {
        name: (ONE_INPUT, WHOLE)
        for name in names
        if grads.one_input(name, few=True) and any(grads.same_input(name, w) for w in held)
    }
    weights: dict[str, list[str]] = {}
    for name, units in {**kinked, **joined}.items():
        if units == (ONE_INPUT, WHOLE):
            weights.setdefault(module_of(name), []).append(name)
    for name in names:
        if name not in joined and any(
            grads.along_input(name, w) for w in weights.get(module_of(name), [])
        ):
            joined[name] = (ONE_INPUT, WHOLE)
    return joined


def anchors(r: UpdateResult, grads: Pair, factor: float) -> dict[str, Units]:
    """The passing gradients of update `r` over `factor` times their noise whose error is one
    input's share, read whole: a choice made per input went otherwise there, and the failing
    tensors that hold the same input's share are its jump (`same_inputs`). Model zoo runs
    190511 and 190402 (a tiny mixture of experts under bfloat16, 20 updates): at update 19
    only two experts' second biases failed (1.59 times allowed), their weights passing at 4.9
    and 5.5 times their noise, 97% rank one, the biases 98% along them; at update 9 only the
    router's weight and bias failed, the experts' first and second weights passing at 27 and
    31 times their noise, 99.9% rank one. And the tensors passing beside those that hold the
    same input's share (`same_inputs`): run 190355 (Adam with eps 1e-6, K=8), only the router's
    bias failed at update 8, along the router's weight, which passed at 21 times its noise, rank
    one, of the input of two experts' weights passing at 15 and 24 times theirs. Without a
    reference no gradient has a noise, and none is read."""
    near = [d.name for d in r.grads if d.ok and d.noise and d.error > factor * d.noise]
    found = {name: grads.one_input(name) for name in near if name in grads}
    held = {name: units for name, units in found.items() if units == (ONE_INPUT, WHOLE)}
    return {**held, **same_inputs([name for name in near if name not in held], held, grads)}


def every_one_input(
    r: UpdateResult, grads: Pair, factor: float
) -> tuple[dict[str, Units], list[str]] | None:
    """Where every failing gradient of update `r` holds one input's share of one input (rank
    one, or beside a weight holding one, failing or passing over its noise, the same input's:
    `same_inputs`): those gradients with their units, and the passing ones beside them. None
    otherwise (no failing gradient, or one of another shape)."""
    failing = [d for d in r.grads if not d.ok]
    if not failing:
        return None
    found = {d.name: grads.jumped(d.name, factor * d.unbounded) for d in failing}
    shares = {name: units for name, units in found.items() if units and units[0] == ONE_INPUT}
    beside = {**anchors(r, grads, factor), **shares}  # passing weights of one input's share too
    shares.update(same_inputs([name for name in found if name not in shares], beside, grads))
    if not shares or set(found) - set(shares):
        return None
    return shares, sorted(name for name in beside if name not in found)


def limits(choice: bool, factor: float) -> tuple[float, float]:
    """The largest share of itself a gradient a quiet jump moved may stand off, and the least
    cosine the model's gradient may turn to: 1/factor and WHOLE_COSINE after kinks (a unit's
    share of one sample); all of itself and CHOICE_COSINE after a choice made per input, whose
    one input's share moves the small sums an expert's and a router's gradients are (a token
    routed otherwise moves the experts it leaves and joins, and the router, by that token's
    share)."""
    return (1.0, CHOICE_COSINE) if choice else (1 / factor, WHOLE_COSINE)
