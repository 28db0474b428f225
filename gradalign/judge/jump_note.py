"""The note for a gradient jump the kink diagnoses excused (judge/kinks.py): where the jump sat
(a kink's rows or columns, one input's share of a tensor, or of same-role tensors stacked), its
echoes upstream, what the step and the loss said of it, and its cause (a kink crossed, a choice
made per input), ending "not counted as a failure"."""

from __future__ import annotations

from .kink_evidence import Pair
from .kink_shape import JUMP_SHARE, ONE_INPUT, WHOLE
from .results import UpdateResult


def jump_note(
    r: UpdateResult,
    kinked: dict,
    joined: dict,
    echoes: list[str],
    unread: set[str],
    quiet: bool,
    grads: Pair,
    loss: str,
) -> str:
    """The note for a jump excused at update `r`: where it sat (`kinked`, of which `joined`
    hold the same input's share as a weight beside them), its echoes upstream, the norms'
    scales beside it with no rank to read (`unread`); how `grads` read its rank (a sketched
    tensor's, from its grid sums); what its loss said (`loss_as_around`)."""
    failing = [d for d in r.grads if d.name in kinked]
    worst = max([d for d in failing if d.name not in joined] or failing, key=lambda d: d.ratio)
    upstream = (
        f" (and {', '.join(echoes)} upstream of it, each off by a smaller share of itself)"
        if echoes
        else ""
    )
    if unread:
        upstream += (
            f" (and {', '.join(sorted(unread))} beside it, a norm's scale with no rank to read)"
        )
    around = (
        "its step left every weight within its noise"
        if quiet
        else "the updates around it and the weights stayed within noise"
    )
    floor = "noise floor" if worst.noise else "allowed error"  # judged by tolerances
    axis, held = kinked[worst.name]
    if worst.name in joined:
        where = f"one input's share of {worst.name} (as a weight beside it holds, rank one)"
    elif axis == ONE_INPUT and grads.stacked_among(worst.name):
        where = (
            f"two inputs' shares of {worst.name} ({JUMP_SHARE:.0%} of the error of it and of "
            f"{', '.join(n for n in grads.stacked_among(worst.name) if n != worst.name)}, "
            f"same-role tensors stacked, in two outer products{grads.rank_read(worst.name)})"
        )
    elif axis == ONE_INPUT:
        where = f"one input's share of {worst.name} ({JUMP_SHARE:.0%} of the error"
        where += (
            " in one outer product, rank one"
            if held == WHOLE
            else f" in slabs {sorted(held)} of its first axis, the outer products of one input "
            "in each or of two inputs the slabs share"
        )
        where += f"{grads.rank_read(worst.name)})"
    else:
        rows = max(len(held) for axis, held in kinked.values() if axis != ONE_INPUT)
        where = f"{rows} row(s) or column(s) of {worst.name}"
    if axis == ONE_INPUT:
        cause = (
            "a choice made per input (a token routed to another expert, an argmax, a tie) "
            "went one way in one run and the other way in the other (the baseline makes "
            "such choices apart from the reference too)"
        )
    else:
        cause = (
            "an activation crossed its kink in one run and not the other (the baseline "
            "shows such jumps against the reference too)"
        )
    return (
        f"update {r.update}: the gradient of {', '.join(kinked)} jumped to "
        f"{worst.ratio:.3g}x its {floor} in {where}{upstream}, while {around} and {loss}: "
        f"{cause}; not counted as a failure"
    )
