"""The noise model's passes over a whole run, after each update was judged on its own: what a
float64 reference says honest float32 training may do that one update's noise cannot foresee
(noise pooled and carried, sizes on parted paths, kinks crossed and the divergences they
start, high gains, a step scaled by a norm noise moved, losses the weights explain, losses a
parted run's choices moved), in the order each needs the others' verdicts. Without a
reference the isolated kinks and their divergences are measured against the baseline."""

from __future__ import annotations

from ..runs.model import Run
from .baseline_jumps import excuse_jumps_like_the_baselines
from .gains import follow_gain_divergence
from .kink_divergence import follow_kink_divergence
from .kinks import excuse_isolated_jumps, first_failing
from .noise import carry_admitted_excess, carry_rounding, explain_loss_by_weights, pool_noise
from .parted_losses import excuse_parted_losses
from .parted_sizes import widen_parted_sizes
from .results import UpdateResult
from .scaled_step_divergence import follow_scaled_step
from .views import Sketching


def honest_differences(
    results: list[UpdateResult],
    base: Run,
    merged: Run,
    reference: Run | None,
    factor: float,
    seen: Sketching | None = None,
) -> list[str]:
    """Widen or excuse, in place, what the noise model explains; the notes that say so. The
    losses the weights explain are read first (a loss failing just before a kink hid the kink)
    and again once kinks are followed (more weights pass). A kink's rules read the first
    failing update: where none was followed and a gain then made that update pass, they read
    the next (model zoo run 92045: a gain at update 0 hid a kink at update 3). `seen`: the runs
    are seen through sketches (judge/views.py)."""
    if reference is None:
        if not (base.full_weights and merged.full_weights):
            return []
        explained = explain_loss_by_weights(results, merged, base, factor, seen=seen)
        notes = excuse_isolated_jumps(results, merged, base, factor, seen)
        notes += follow_kink_divergence(results, merged, base, factor, seen)
        explain_loss_by_weights(results, merged, base, factor, explained, seen)
        return notes + excuse_parted_losses(results)
    pool_noise(results, factor)
    parted = widen_parted_sizes(results, factor)
    carry_rounding(results)
    carry_admitted_excess(results, factor)
    explained = explain_loss_by_weights(results, merged, reference, factor, seen=seen)
    notes = parted + excuse_isolated_jumps(results, merged, reference, factor, seen)
    notes += excuse_jumps_like_the_baselines(results, base, merged, reference, factor, seen)
    kinks = follow_kink_divergence(results, merged, reference, factor, seen)
    first = first_failing(results)
    gains = follow_gain_divergence(results, merged, reference, factor, seen)
    notes += kinks + gains
    if gains and not kinks and first_failing(results) not in (first, None):
        notes += follow_kink_divergence(results, merged, reference, factor, seen)
    if not (kinks or gains):
        notes += follow_scaled_step(results, merged, reference, factor, seen)
    explain_loss_by_weights(results, merged, reference, factor, explained, seen)
    return notes + excuse_parted_losses(results)
