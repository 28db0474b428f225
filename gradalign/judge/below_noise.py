"""A known bug's exact shape under the noise floor.

Against a float64 reference a difference passes while it stays within the baseline's own
distance from that reference. Where the baseline's rounding is large and the merged run shares
it (each sample computed alike: a cancellation in a per-sample centering of inputs near 1e5
puts a float32 gradient 0.6% off float64), a bug smaller than that rounding passes: a weight
penalty counted K times, 0.4% of the gradient. Noise has no shape; these bugs have one. So a
comparison that passes is read once more at its first two updates: where the merged gradient
differs from the baseline's beyond the fixed tolerance and a bug's exact relation explains the
difference (≥ 95%, as each signature requires when it names a failure), it fails by that bug.
Only where some tensor's gradient is off the baseline's beyond the fixed tolerance are the
gradients read whole, and only for models of up to 2^24 parameters.
"""

from __future__ import annotations

import math

from .results import FAIL, Check, Comparison, Diagnosis
from .signatures.accumulation import grad_not_cleared, penalty_not_scaled
from .signatures.common import grads_of, relative_error

SHAPES = (penalty_not_scaled, grad_not_cleared)  # relations a fitted share must explain
CHECK = "no bug's shape under the noise floor"
MAX_ELEMENTS = 1 << 24  # a model read whole at two updates: past this, left to the noise floor


def shape_below_noise(c: Comparison) -> tuple[Check, Diagnosis, dict] | None:
    """The failing check, the diagnosis and the first divergence, for a comparison against a
    reference that passes although a bug's relation explains its gradient difference; None
    otherwise."""
    if c.reference is None or c.verdict == FAIL:
        return None
    elements = sum(math.prod(t.shape) for t in c.merged.tensors if t.kind == "param")
    if elements > MAX_ELEMENTS:  # the gradients would be read whole: the memory bound holds
        return None
    for r in c.results[:2]:
        tol = c.tolerances.grad_rtol
        if not any(d.rel_l2 > tol and math.isfinite(d.rel_l2) for d in r.grads):
            continue  # every tensor within the fixed tolerance: rounding alone can do that
        gb, gm = grads_of(c, c.baseline, r.update), grads_of(c, c.merged, r.update)
        error = relative_error(gb, gm) if gb is not None and gm is not None else None
        if error is None or not error > tol:
            continue
        for signature in SHAPES:
            found = signature(c, r)
            if found is None:
                continue
            found.message += (
                f"; below the noise floor: the gradient is {error:.3g} off the baseline's "
                "(relative L2), less than the baseline's own distance from the float64 "
                "reference, but rounding has no such shape (the merged run shares the "
                "baseline's rounding of each sample)"
            )
            found.evidence["below_noise_floor"] = True
            detail = f"at update {r.update}: {found.code} explains the gradient difference"
            where = {"update": r.update, "parameter": None, "in": "gradient"}
            return Check(CHECK, FAIL, detail), found, where
    return None
