"""A divergence that starts where rounding noise moved the norm an optimizer scales a tensor's
whole step by, followed as a kink's divergence is (judge/kink_divergence.py).

transformers' `Adafactor` (the Trainer's `optim="adafactor"`) divides each tensor's update by
its RMS over the tensor once that exceeds 1 (update clipping), and LAMB and LARS scale it by a
trust ratio. Where some elements' gradients are rounding noise (an attention key bias: softmax
ignores it), each float32 run normalizes its own noise to steps as large as any other's, while
a float64 reference steps them by almost nothing. The norm then differs between the runs by one
draw of that noise each, and every other element of the tensor steps by the reference's step
times one common factor (judge/coupled_steps.py reads that shape). The baseline's draw is one
sample: where its norm stayed below the clip and the merged run's did not, the merged run alone
stepped that tensor's other elements off by a share of their step, and from the next update on
every gradient of the model stood off by what those weights moved. Model zoo runs 290804 and
290844 (a GPT-NeoX under transformers' `Adafactor`, K=4 and K=8): at update 6, the merged run's
layer-1 `query_key_value.bias` stepped 0.904 times as far as the reference's outside the 24 of
its 96 elements whose gradients are noise (they held 41% of its step); at update 7 the model's
gradients stood up to 0.15% of their norm off (the baseline's 1e-6) and `attention.dense.weight`
0.04% of what it moved, 3.5 times what was allowed: `unexplained`, where the training was the
same. The baseline's own norm moved so at update 8, its gradients then 4e-4 off.

`follow_scaled_step` recognises it at the first failing update, where no kink or gain was
followed: no bookkeeping problem, the loss and every earlier update within noise, and at one of
the two updates before it a tensor whose merged step shows that shape against the reference's
(its noise-dominated elements holding at least the factor's distance from 1 of the step, what
is left after the factor at most 5% of that distance). The parting's size is read at the first
failing update (its failing gradients' largest share of their norm, its failing weights' of how
far they moved since the update before the scaled step), and must stay within that factor's
distance from 1: one tensor's step off by a share moves the model by less. From there the
divergence is followed as a kink's, at that size, with a note.

An accumulation bug moves the gradients of the update it starts at by shares of 1/K and more in
every tensor its windows touch, beyond the share one tensor's step stood off, and it needs no
tensor of noise-dominated elements stepped by a common factor the update before. Where the runs
kept sketches, the tensors they kept whole are read (a bias, 1-D), and the parting's size is
estimated from the sketches as a kink's is.
"""

from __future__ import annotations

import math

from ..runs.model import Run
from .coupled_steps import scaled_steps
from .kink_divergence import Followed, follow_from, widening
from .kink_evidence import apart
from .kinks import first_failing
from .results import UpdateResult
from .views import Sketching

REACH = 2  # the scaled step at most this many updates before the first failing one


def follow_scaled_step(
    results: list[UpdateResult], merged: Run, ref: Run, factor: float, seen: Sketching | None = None
) -> list[str]:
    """Widen the updates from a scaled step's divergence on by its size (module docstring); a
    note if the first failing update is one. `ref`: the float64 reference."""
    first = first_failing(results)
    if first is None:
        return []
    at = results[first]
    u = at.update
    if at.problems or not at.loss_ok or u < 1:
        return []
    events = scaled_steps(ref, merged, max(0, u - REACH), u - 1, seen)
    if not events:
        return []
    i, name, dominated, size, share, scaled, left = max(events, key=lambda e: abs(e[5] - 1.0))
    off = abs(scaled - 1.0)
    if factor * off >= 1:  # a gradient allowed to differ by all of itself is not checked
        return []
    since = i - 1  # the weights the scaled step started from
    grads = apart(merged, ref, "grads", u, seen)
    weights = apart(merged, ref, "weights", u, seen, since)
    if grads is None or weights is None:
        return []
    j_grads = max((grads.share(d.name) for d in at.grads if not d.ok), default=0.0)
    j_weights = max([j_grads, *(weights.share(d.name) for d in at.weights if not d.ok)])
    if not (math.isfinite(j_weights) and j_weights <= off):
        return []  # parted by more than one tensor's step stood off: not this
    start = f"update {since}" if since >= 0 else "the start"
    notes = [
        f"update {i}: the merged run's step of {name} stood {scaled:.6g} times the reference's "
        f"outside its {dominated} of {size} elements whose gradient is rounding noise (they "
        f"held {share:.0%} of its step; what is left {left:.2g} of it): an optimizer that "
        "scales a tensor's whole step by a norm over it (Adafactor's update clipping, LAMB's "
        "or LARS's trust ratio), which the runs' rounding noise moved, and the runs follow "
        f"neighbouring trajectories from there. {widening(u, factor, j_grads, j_weights, start)} "
        f"(the parting's size at update {u}, within the {off:.3g} of its step that tensor stood "
        "off)"
    ]
    followed = Followed(at, grads, since, j_grads, j_weights, start)
    return notes + follow_from(results[first:], followed, merged, ref, factor, seen)
