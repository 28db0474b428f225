"""A choice made per input (a token routed to another expert, an argmax, a tie) that went one way
in one run and the other way in the other, as the kink diagnoses read it (judge/kinks.py): what
else holds the same input's share at its jump (`same_inputs`), and how far a quiet jump and the
runs parted after one may stand off (`limits`). One input's share moves the small sums an
expert's and a router's gradients are by a share of themselves, where a ReLU unit's kink moves
one sample's share of one unit among many."""

from __future__ import annotations

import math
from dataclasses import dataclass

from .kink_evidence import Pair
from .kink_shape import ONE_INPUT, ONE_INPUT_SLABS, WHOLE, Units, fused_experts
from .metrics import module_of
from .results import UpdateResult

WHOLE_COSINE = 0.999  # a model's gradient turned below this cosine moved as a whole ...
CHOICE_COSINE = 0.99  # ... or below this one, where the runs parted at a choice made per input
ROUTE_GAP = 4  # a token's route stands off by this many times the share of what it echoes into
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
    experts' (0.996), and its bias 98% along it, 48% off. Beside fused experts held in slabs
    (`kink_shape.one_input`), a router's input is read against each slab's
    (`Pair.same_slab_input`). A bias may lie along its module's weight where that weight
    passed, quiet, its error still one input's share of the jump's input: model zoo run 235043
    (a tiny mixture of experts under float16 autocast, Adagrad, K=8) failed only the router's
    bias beside two experts' weights, its router's weight within its noise yet rank one and of
    the experts' input. Fused experts' biases (one row per expert) hold the token's δ in the
    rows of the slabs their module's fused weights hold its share in (`fused_bias_rows`, as
    `routed` reads them): model zoo run 244211 (gpt-oss under float16 autocast, Adadelta, K=6)
    failed at update 7 with layer 0's fused weights in slabs 2 and 3 and its gate-up bias in
    rows 2 and 3, which no other rule read."""
    held = [name for name, units in kinked.items() if units == (ONE_INPUT, WHOLE)]
    slabs = [
        (name, slab)
        for name, (axis, units) in kinked.items()
        if axis == ONE_INPUT and units != WHOLE
        for slab in sorted(units)
    ]  # fused experts held in slabs: each slab's input
    if not held and not slabs:
        return {}

    def of_the_input(weight: str) -> bool:
        """Whether a weight's error is one input's share, whole, of the jump's input, or lies
        in the two inputs a held weight's error holds (two tokens: `Pair.within_inputs`)."""
        if any(grads.within_inputs(weight, w) for w in held if w != weight):
            return True
        if not grads.one_input(weight, few=True):
            return False
        return any(grads.same_input(weight, w) for w in held) or any(
            grads.same_slab_input(weight, w, slab) for w, slab in slabs
        )

    joined = {name: (ONE_INPUT, WHOLE) for name in names if of_the_input(name)}
    weights: dict[str, list[str]] = {}
    for name, units in {**kinked, **joined}.items():
        if units == (ONE_INPUT, WHOLE):
            weights.setdefault(module_of(name), []).append(name)
    for name in names:  # a bias whose weight passed, rank one, of the same input as the jump's
        module = module_of(name)
        weight = f"{module}.weight"
        if module in weights or name == weight or weight not in grads or weight in names:
            continue
        if len(grads.shape(weight)) == 2 and of_the_input(weight):
            weights[module] = [weight]
    for name in names:
        if name not in joined and any(
            grads.along_input(name, w) for w in weights.get(module_of(name), [])
        ):
            joined[name] = (ONE_INPUT, WHOLE)
    in_slabs: dict[str, list] = {}  # by module, the units of the weights held in slabs
    for w, (axis, units) in kinked.items():
        if axis == ONE_INPUT and units != WHOLE:
            in_slabs.setdefault(module_of(w), []).append(units)
    for name in names:  # fused experts' biases (two axes) beside their module's slabs
        held_here = in_slabs.get(module_of(name))
        if name not in joined and held_here and len(grads.shape(name)) == 2:
            rows = fused_bias_rows(name, grads, held_here)
            if rows is not None:
                joined[name] = (ONE_INPUT, rows)
    return joined


def fused_bias_rows(name: str, grads: Pair, slabs: list) -> frozenset | None:
    """The rows of fused experts' bias `name` (one row per expert) that hold its error, where
    they lie within the slabs one of `slabs` (a fused weight's units) holds one input's share
    in: a token's δ in the experts it left and joined (two tokens' in theirs). None
    otherwise."""
    most = max([ONE_INPUT_SLABS, *(len(these) for these in slabs)])
    rows = grads.units(name, most, of_rows=1.0)
    if rows is None or rows[0] != 0 or not any(rows[1] <= these for these in slabs):
        return None
    return rows[1]


def anchors(r: UpdateResult, grads: Pair, factor: float) -> dict[str, Units]:
    """The passing gradients of update `r` over `factor` times their noise whose error is one
    input's share, read whole or in fused experts' slabs: a choice made per input went otherwise
    there, and the failing tensors that hold the same input's share are its jump
    (`same_inputs`). Model zoo runs 190511 and 190402 (a tiny mixture of experts under bfloat16,
    20 updates): at update 19 only two experts' second biases failed (1.59 times allowed), their
    weights passing at 4.9 and 5.5 times their noise, 97% rank one, the biases 98% along them;
    at update 9 only the router's weight and bias failed, the experts' first and second weights
    passing at 27 and 31 times their noise, 99.9% rank one. And the tensors passing beside those
    that hold the same input's share (`same_inputs`): run 190355 (Adam with eps 1e-6, K=8), only
    the router's bias failed at update 8, along the router's weight, which passed at 21 times
    its noise, rank one, of the input of two experts' weights passing at 15 and 24 times theirs.
    Without a reference no gradient has a noise, and none is read. Model zoo run 233033
    (transformers' Mixtral under float16 autocast, ASGD, K=4): at update 5 only the router's
    weight failed (3.5 times allowed), of the input the fused experts' passing slabs 1 and 3
    hold. Fused experts read in their slabs need half that multiple: one input's share in at
    most two slabs, each rank one, is a token's route wherever it stands, and a route may leave
    them passing where only their bias fails (model zoo run 288941, gpt-oss under float16
    against a float32 reference, SGD with momentum, K=2: at update 15 only the fused
    `down_proj_bias` failed, 98.9% of its error in rows 1 and 2, beside `gate_up_proj` and
    `down_proj` passing at 3.4 and 3.2 times their noise, each one input's share in slabs 1
    and 2). The reading asks 90% of the error in those outer products, so the noise itself
    must stand at a third of the error or less."""
    near = [d.name for d in r.grads if d.ok and d.noise and d.error > factor * d.noise]
    found = {name: grads.one_input(name) for name in near if name in grads}
    for d in r.grads:  # fused experts' slabs between half the multiple and the multiple
        if not (d.ok and d.noise and factor * d.noise >= d.error > factor / 2 * d.noise):
            continue
        if d.name in grads and fused_experts(grads.shape(d.name)):
            units = grads.one_input(d.name)
            if units and units[1] != WHOLE and len(units[1]) <= ONE_INPUT_SLABS:
                found[d.name] = units
    held = {name: units for name, units in found.items() if units and units[0] == ONE_INPUT}
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
    unread = lone_vectors([name for name in found if name not in shares], grads)
    matrices = [name for name in shares if len(grads.shape(name)) >= 2]
    if not matrices:
        return None
    rest = [name for name in found if name not in shares and name not in unread]
    shares.update(read_after(rest, shares, grads))
    if set(found) - set(shares) - unread:
        return None
    return shares, sorted(name for name in beside if name not in found)


def read_after(names: list[str], shares: dict[str, Units], grads: Pair) -> dict[str, Units]:
    """Of `names`, the matrices whose error is one input's share of an input of their own,
    off by ROUTE_GAP times less of themselves than the furthest of `shares` (the choice's
    tensors, each one input's share): a layer after the route that reads the token's changed
    output one token at a time; and the biases of their modules whose error lies along them
    (`Pair.along_input`: the token's δ there). Model zoo run 260071 (a tiny mixture of experts
    under float16 autocast, AdamW, K=5, micro-batches of unequal sizes): a token moved from
    expert 0 to expert 2 at update 3, the experts' gradients 10% to 25% off and rank one, the
    router's of their input, and the output layer's weight 1.8% off, rank one, of the token's
    output."""
    if not shares:
        return {}
    furthest = max(grads.share(name) for name in shares)
    found: dict[str, Units] = {}
    for name in names:
        if len(grads.shape(name)) < 2 or ROUTE_GAP * grads.share(name) > furthest:
            continue
        units = grads.one_input(name, few=True)
        if units is not None and units[0] == ONE_INPUT:
            found[name] = units
    weights = {module_of(name): name for name in found}
    for name in names:
        weight = weights.get(module_of(name))
        if name not in found and weight is not None and grads.along_input(name, weight):
            found[name] = (ONE_INPUT, WHOLE)
    return found


def lone_vectors(names: list[str], grads: Pair) -> set[str]:
    """Of `names`, the gradients of one axis whose module holds no matrix (a norm's scale: no
    weight for its error to lie along, as a bias's does, and no rank of its own to read): the
    matrices beside them say what the jump is. Model zoo run 233028 (gpt-oss under float16
    autocast, Adadelta, K=4): a token routed otherwise at update 2, its echo failing layer 1's
    input norm's scale beside attention weights each one input's share."""
    modules = {module_of(name) for name in grads.names() if len(grads.shape(name)) >= 2}
    return {name for name in names if len(grads.shape(name)) < 2 and module_of(name) not in modules}


def lone_beside_choice(
    r: UpdateResult, unread: set[str], beside: dict, grads: Pair, loss: str
) -> str | None:
    """Where the only gradients of update `r` that failed are norms' scales (`lone_vectors`,
    `unread`: no rank to read), the step left every weight within its noise, and passing
    matrices over their noise hold one input's share (`anchors`, in `beside`): a choice made
    per input went otherwise there, the scales its echo. The note that says so, each scale off
    by less than all of itself (the caller reads the model's gradient as a whole, not scaled
    nor turned below CHOICE_COSINE); None otherwise. Model zoo run 254035 (transformers'
    Mixtral under float16 autocast, ASGD, K=2): at update 11 only layer 1's post-attention
    norm's scale failed (96 times its noise, 4.5% of itself), beside the fused experts'
    passing slabs 0 and 3 and the router's weight, 63 to 80 times their noise, each one
    input's share. `loss`: what the loss says, in words (`jump_losses.loss_as_around`)."""
    chosen = sorted(name for name, (axis, _) in beside.items() if axis == ONE_INPUT)
    if not unread or not any(len(grads.shape(name)) >= 2 for name in chosen):
        return None
    if max(grads.share(name) for name in unread) >= 1.0:
        return None
    shown = ", ".join(sorted(unread))
    return (
        f"update {r.update}: only the gradient of {shown} failed, a norm's scale with no rank "
        f"to read, beside {', '.join(chosen)}, passing over their noise, each one input's "
        "share: a choice made per input (a token routed to another expert) went one way in "
        "one run and the other way in the other, and its step left every weight within its "
        f"noise and {loss}; not counted as a failure"
    )


@dataclass(frozen=True)
class Route:
    """`routed`'s reading: the failing gradients furthest off (`held`: each one input's share,
    with its units; `vectors`: those of one axis beside them, which hold no rank to read), the
    rest (`echoes`, furthest off first, the first `echo_share` of itself off) and how many
    times further off than the furthest echo the nearest held one stands (`gap`)."""

    held: dict[str, Units]
    vectors: list[str]
    echoes: list[str]
    echo_share: float
    gap: float


def routed(r: UpdateResult, grads: Pair, factor: float) -> Route | None:
    """A token routed to another expert in one run, seen with what it echoes into: the failing
    gradients of update `r`, ranked by the share of themselves they stand off, split where one
    stands ROUTE_GAP times further off than the next; above the split, every matrix holds one
    input's share (rank one, whole or in slabs; a router's matrix of few rows too; fused
    experts' biases, one row per expert, in rows of the slabs a fused weight holds it in) and at
    least two do, and the vectors beside them are not read. The token moves the experts it
    leaves and joins and the router by its share of their small sums; its changed output and
    backward then move every layer they pass through by far smaller shares of theirs. In
    float32, where rounding leaves a gradient 1e-7 of itself off, those echoes fail too: model
    zoo run 231000 (transformers' Mixtral, experts fused, Adagrad, K=2) at update 2 had layer
    1's fused experts 2.2% and 1.9% off in two slabs (experts 0 and 3) and its router 1.5%,
    every other gradient 0.11% or less (13 times less), each failing; run 231252 (Adam, K=4) the
    same at update 6, 7.4 times apart; run 231530 (gpt-oss, its experts' biases fused too,
    Adagrad, K=6) at update 4, 4.2 times apart. None where no such split is, or above it a
    matrix holds no one input's share (a bug moves every tensor by like shares, spread in each)."""
    failing = [d for d in r.grads if not d.ok and d.name in grads]
    ranked = sorted(((grads.share(d.name), d) for d in failing), key=lambda p: -p[0])
    if len(ranked) < 2 or not all(math.isfinite(share) for share, _ in ranked):
        return None
    cut = next(
        (i for i in range(1, len(ranked)) if ranked[i - 1][0] >= ROUTE_GAP * ranked[i][0]), None
    )
    if cut is None:
        return None
    band = [d for _, d in ranked[:cut]]
    matrices = [d for d in band if len(grads.shape(d.name)) >= 2]
    held: dict[str, Units] = {}
    for d in matrices:
        units = grads.jumped(d.name, factor * d.unbounded) or grads.one_input(d.name, few=True)
        if units is not None and units[0] == ONE_INPUT:
            held[d.name] = units
    slabs = [units[1] for units in held.values() if units[1] != WHOLE]
    for d in matrices:  # fused experts' biases: the token's δ in its experts' rows
        rows = None if d.name in held else fused_bias_rows(d.name, grads, slabs)
        if rows is not None:
            held[d.name] = (ONE_INPUT, rows)
    if len(held) < 2 or len(held) < len(matrices):
        return None
    vectors = [d.name for d in band if d.name not in held]
    gap = ranked[cut - 1][0] / ranked[cut][0] if ranked[cut][0] > 0 else math.inf
    return Route(held, vectors, [d.name for _, d in ranked[cut:]], ranked[cut][0], gap)


def limits(choice: bool, factor: float) -> tuple[float, float]:
    """The largest share of itself a gradient a quiet jump moved may stand off, and the least
    cosine the model's gradient may turn to: 1/factor and WHOLE_COSINE after kinks (a unit's
    share of one sample); all of itself and CHOICE_COSINE after a choice made per input, whose
    one input's share moves the small sums an expert's and a router's gradients are (a token
    routed otherwise moves the experts it leaves and joins, and the router, by that token's
    share)."""
    return (1.0, CHOICE_COSINE) if choice else (1 / factor, WHOLE_COSINE)
