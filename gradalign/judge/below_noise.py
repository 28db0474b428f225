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
gradients read, at any size: a slice at a time (judge/fits.py; before session 90 they were
read whole, and only in models of up to 2^24 parameters). Without a reference the
same holds within the fixed tolerance: a penalty of 1e-6 counted K times moved the built-in
MLP's gradient 3.9e-5 of itself, within grad_rtol (1e-4), and passed; read where the difference
stands beyond `ROUNDINGS` units of the compute dtype's epsilon (relative L2), it fails by that
shape (99.6% explained), the clean pair 1.5e-7 apart.

Without a reference the fixed tolerances judge, and in 16 bits they are coarse: at an update the
runs enter with weights apart, a gradient may differ by `grad_rtol_apart` (0.3 in bfloat16). A
short last window that a framework divides by K (accelerate's `accumulate()`, Lightning's
automatic optimization) steps with n/K of the baseline's gradient, 0.75 at n = 3 of K = 4, and
passed there. Noise turns a gradient and leaves its size; a loss scaled by one of the ratios a
wrong scale makes (K, 1/K, K+1, n/K: `loss_scale`'s variants, to 1e-3) at a cosine beyond the
noise (ALONG_OVER_ACROSS times what the noise turned the gradient by, measured across it) is
that bug, whatever the tolerance: such an update fails by it (`scale_beyond_tolerance`).

A float32 sum of many terms is a 16-bit number by chance about once in 2^16 values; a gradient
summed in a bfloat16 (float16) buffer is one in every value. A passing comparison's merged
gradient is read at every update where it was kept whole, a sample of each tensor first
(`undeclared.sixteen_bit_kind`): where every sampled value is 16-bit, or each tensor sampled at
1,024 values or more holds at most 2^7 float32 mantissas (bfloat16 numbers times one factor, as
a clip that engaged after the sum leaves them: `accum_dtype.few_mantissas`), and
`grad_accum_dtype` reads the baseline's as wider, the run fails by it (`narrow_sums`), however
small its rounding against what the runs may differ by. Model zoo run 195331 (a text CNN under
RMSprop, K=8, 40 updates, float32), gradients summed in bfloat16 from update 8, after kinks the
runs parted at: a few tenths of a percent off, within the divergence followed, it passed.
"""

from __future__ import annotations

import math

import numpy as np

from ..runs.model import Tensors
from .results import FAIL, Check, Comparison, Diagnosis
from .rounding import ROUNDINGS
from .signatures.accum_dtype import few_mantissas, grad_accum_dtype, many_mantissas
from .signatures.accumulation import EXPLAINED, grad_not_cleared, penalty_not_scaled
from .signatures.common import RATIO_MATCH, exact_of, grads_of, relative_error, window
from .signatures.gradient import loss_scale
from .tolerances import eps, held_exactly
from .undeclared import sample_of, sixteen_bit_kind

SHAPES = (penalty_not_scaled, grad_not_cleared)  # relations a fitted share must explain
CHECK = "no bug's shape under the noise floor"
FIXED_CHECK = "no bug's shape within the fixed tolerance"
SCALE_CHECK = "no wrong loss scale within the tolerance"
NARROW_CHECK = "no gradient summed in 16 bits"
ALONG_OVER_ACROSS = 10.0  # a scale within the tolerance stands this far beyond the turn noise made


def shape_below_noise(c: Comparison) -> tuple[Check, Diagnosis, dict] | None:
    """The failing check, the diagnosis and the first divergence, for a comparison that passes
    although a bug's relation explains its gradient difference; None otherwise."""
    if c.verdict == FAIL:
        return None
    narrow = narrow_sums(c)
    if narrow is not None:
        return narrow
    if c.reference is None:
        scaled = scale_beyond_tolerance(c)
        if scaled is not None:
            return scaled
        return _shaped(c, ROUNDINGS * eps(c.dtype), FIXED_CHECK, _WITHIN_TOLERANCE)
    return _shaped(c, c.tolerances.grad_rtol, CHECK, _BELOW_FLOOR)


_BELOW_FLOOR = (
    "; below the noise floor: the gradient is {error:.3g} off the baseline's (relative L2), "
    "less than the baseline's own distance from the float64 reference, but rounding has no such "
    "shape (the merged run shares the baseline's rounding of each sample)"
)
_WITHIN_TOLERANCE = (
    "; within the fixed tolerance: the gradient is {error:.3g} off the baseline's (relative L2), "
    "less than grad_rtol, but rounding has no such shape"
)


def _shaped(
    c: Comparison, floor: float, check: str, said: str
) -> tuple[Check, Diagnosis, dict] | None:
    """At the first two updates, a bug's relation that explains the gradient difference where
    that difference is beyond `floor` (relative L2): the check, diagnosis and divergence."""
    for r in c.results[:2]:
        if not any(d.rel_l2 > floor and math.isfinite(d.rel_l2) for d in r.grads):
            continue  # every tensor within the floor: rounding alone can do that
        gb, gm = grads_of(c, c.baseline, r.update), grads_of(c, c.merged, r.update)
        error = relative_error(gb, gm) if gb is not None and gm is not None else None
        if error is None or not error > floor:
            continue
        for signature in SHAPES:
            found = signature(c, r)
            if found is None or found.evidence["explained_share"] < EXPLAINED:
                continue  # under the floor, "the rest within the noise" is all of it
            found.message += said.format(error=error)
            found.evidence["below_noise_floor"] = True
            detail = f"at update {r.update}: {found.code} explains the gradient difference"
            where = {"update": r.update, "parameter": None, "in": "gradient"}
            return Check(check, FAIL, detail), found, where
    return None


def narrow_sums(c: Comparison) -> tuple[Check, Diagnosis, dict] | None:
    """The first update whose merged gradient, kept whole, holds only 16-bit numbers where the
    baseline's are wider (module docstring): the check, diagnosis and first divergence."""
    for r in c.results:
        merged = exact_of(c, c.merged, "grads", r.update)
        values = _sample_unless_wide(merged) if merged else None
        if not values or (sixteen_bit_kind(merged, values) is None and not few_mantissas(values)):
            continue  # the sample first: the whole gradients only where it reads 16-bit
        found = grad_accum_dtype(c, r)
        if found is None:
            continue
        found.message += (
            "; within what the runs may differ by here, but rounding leaves no float32 sum a "
            "16-bit number"
        )
        detail = f"at update {r.update}: {found.code}"
        where = {"update": r.update, "parameter": None, "in": "gradient"}
        return Check(NARROW_CHECK, FAIL, detail), found, where
    return None


def _sample_unless_wide(grads: Tensors) -> list[np.ndarray] | None:
    """Each tensor's sample (`undeclared.sample_of`), or None from the first whose values no
    16-bit type holds and whose mantissas no 16-bit sum times one factor leaves (a float32 sum
    of many terms: a clean run's first tensor, read alone)."""
    values = []
    for name in grads:
        v = sample_of(grads, name)
        exact = any(held_exactly(v, narrow).all() for narrow in ("bfloat16", "float16"))
        if not exact and many_mantissas(v):
            return None
        values.append(v)
    return values


def scale_beyond_tolerance(c: Comparison) -> tuple[Check, Diagnosis, dict] | None:
    """`scaled_within_tolerance` for a comparison that passed: its check, diagnosis and first
    divergence."""
    found = scaled_within_tolerance(c)
    if found is None:
        return None
    update = found.evidence["update"]
    detail = f"at update {update}: {found.code} explains the gradient difference"
    where = {"update": update, "parameter": None, "in": "gradient"}
    return Check(SCALE_CHECK, FAIL, detail), found, where


def scaled_within_tolerance(c: Comparison) -> Diagnosis | None:
    """The first update whose merged gradient is the baseline's times one of the ratios a wrong
    loss scale makes, named by `loss_scale` with that ratio (not its fallback, a pure scale no
    ratio explains), where the fixed tolerance let the gradient pass (without a reference; a
    failing run's weights may then fail from it alone, `unexplained` before this)."""
    k = window(c)
    if k < 2 or c.reference is not None:
        return None
    for r in c.results:
        ratio = r.grad_ratio
        if ratio is None or not math.isfinite(ratio) or not r.grads:
            continue
        if any(not d.ok for d in r.grads):
            continue  # failed: read by its shape already
        n = int(c.merged.sizes[r.update])
        variants = {float(k), 1 / k, float(k + 1), n / k}
        if not any(abs(ratio / v - 1) <= RATIO_MATCH for v in variants if v != 1):
            continue
        cosine = min(1.0, r.grad_cosine or 0.0)
        across = abs(ratio) * math.tan(math.acos(max(cosine, 0.0)))  # what noise turned it by
        found = loss_scale(c, r, share=ALONG_OVER_ACROSS * across)
        if found is None or "expected_ratio" not in found.evidence:
            continue
        found.message += (
            "; within the fixed tolerance, which a gradient at other weights in 16 bits may "
            "differ by, but rounding turns a gradient and leaves its size: this is a scale"
        )
        found.evidence["within_tolerance"] = True
        return found
    return None
