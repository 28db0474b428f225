"""What a passing comparison says: `within-noise`, how close the runs stand to what is allowed
(against the float64 reference's noise floor, or the dtype's tolerances without one), and
where the noise model allowed more than its factor."""

from __future__ import annotations

import math

from .distributed import listed
from .results import Comparison, Diagnosis


def _farthest_from_reference(c: Comparison) -> str:
    """Where the merged run stands farthest from the reference for the baseline's own error,
    said beside that figure: the table shows each update's worst tensor by err/tol, which is
    often another one (a tensor the baseline computed almost exactly is far in this ratio
    and well within what it is allowed)."""
    found = [
        (d.error / d.noise, f"{d.name}{kind}", r.update, d.ratio)
        for r in c.results
        for kind, diffs in (("", r.weights), (" (grad)", r.grads))
        for d in diffs
        if d.excused is None and d.noise
    ]
    _, name, update, ratio = max(found, key=lambda f: f[0])
    return f", at {name} (update {update}), which stands at {ratio:.2g}x what it is allowed"


def why_it_passes(c: Comparison) -> list[Diagnosis]:
    """Why a comparison passes: how far within its noise floor or tolerances, and what else a
    reader should know (dropout drawn alike in both runs)."""
    judged = [d for r in c.results for d in (*r.weights, *r.grads) if d.excused is None]
    worst = max((d.ratio for d in judged), default=0.0)
    if c.reference is not None:
        noise = [d.error / d.noise for d in judged if d.noise]
        factor, farthest = c.tolerances.noise_factor, max(noise, default=0.0)
        allowed = (
            f"{_farthest_from_reference(c)}; beyond {factor:g}x where the noise model says why: "
            "one rounding of the tensor where the baseline computed it almost exactly, a small "
            "tensor's noise measured on few elements, the drift of noise-dominated elements, a "
            "kink crossed in one run, an element's high optimizer gain or a tensor's step "
            "scaled by a norm noise moved (noted)"
            if farthest > factor
            else f" (allowed {factor:g}x)"
        )
        message = (
            f"every weight and gradient is within {worst:.2g}x its noise floor: the merged run "
            f"is at most {farthest:.2g}x as far from the {c.reference.dtype} reference as "
            f"the {c.dtype} baseline is{allowed}"
        )
        if len(judged) < sum(len(r.weights) + len(r.grads) for r in c.results):
            message += (
                "; gradients excused as noted (a kink's jump, runs parted) are not counted here"
            )
        evidence = {
            "worst_ratio_to_floor": worst,
            "worst_error_over_noise": max(noise, default=0.0),
        }
    else:
        losses = [r.loss_error / r.loss_allowed for r in c.results if r.loss_allowed > 0]
        worst = max([worst, *[q for q in losses if math.isfinite(q)]])  # a log's losses too
        message = (
            f"every check is within the {c.dtype} tolerances (worst err/tol {worst:.2g}); "
            "no reference run was given, so the noise floor itself was not measured"
        )
        evidence = {"worst_err_over_tol": worst}
        # named where the drift let an element stand beyond what the tolerance alone allows
        dominated = sorted(
            {d.name for r in c.results for d in r.weights if d.drift and d.drift > d.allowed}
        )
        if dominated:
            message += (
                "; where both runs' gradients were rounding noise (they disagreed by more than "
                "either's size), the weights step where it points: those elements of "
                f"{listed(dominated, 3)} were judged by their gradients alone (a bias within "
                "their tolerance builds up unseen there without a float64 reference)"
            )
            evidence["noise_dominated_weights"] = dominated
    found = [Diagnosis("within-noise", message, evidence, None, "info")]
    dropout = c.merged.model_facts.get("dropout")
    if dropout:
        found.append(
            Diagnosis(
                "cross-sample-layers",
                f"the model has dropout ({', '.join(dropout)}) and both runs drew the same masks",
                {"dropout_layers": list(dropout)},
                None,
                "info",
            )
        )
    return found
