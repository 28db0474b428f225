"""The drift of noise-dominated elements (judge/drift.py) and the excess it carries
(judge/noise.py, `carry_admitted_excess`): under Adam near its eps the first step's spread passes
what only the gradient noise moved, and a difference the drift admitted widens the updates after
it alone, by at most the factor squared and never as a ratchet, while a loss K times too large
still fails."""

from __future__ import annotations

import numpy as np
import pytest

from gradalign import api


def test_the_first_step_spread_reads_the_gain_only_above_rounding():
    """At update 0 an element whose weight difference stands above rounding gets the gain
    times what the RMS gradient noise adds to its draw; an element whose difference is
    rounding, whose draw is above the RMS, or that did not start from one weight, gets none."""
    from gradalign.judge.step_rules import MANTISSA, first_step_spread

    rms = 1e-9
    gb = np.array([1e-11, 1e-11, 2e-9, 1e-11])  # draws: below, below, above the RMS, below
    gr = np.zeros(4)
    pb = np.full(4, 0.1)
    pr = np.array([0.1, 0.1, 0.1, 0.2])  # the last started elsewhere (not a first step)
    r = pb - 0.01
    dw = np.array([1e-6, 1e-9, 1e-6, 1e-6])  # the second: a rounding of the step at most
    b = r + dw
    spread = first_step_spread(gb, gr, rms, b, pb, r, pr, MANTISSA["float32"])
    assert spread[0] == pytest.approx(1e-6 * (rms / 1e-11 - 1))
    assert spread[1:].tolist() == [0.0, 0.0, 0.0]


def _known(tmp_path, seed: int, bug: bool = False):
    import importlib.util

    from tests.conftest import ROOT

    spec = importlib.util.spec_from_file_location("kfa", ROOT / "bench" / "adam_near_eps.py")
    kfa = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(kfa)
    kfa.record(tmp_path / "ref", 1, seed, float64=True)
    kfa.record(tmp_path / "base", 1, seed, reference="../ref")
    kfa.record(tmp_path / "merged", 4, seed, bug=bug)
    return tmp_path / "base", tmp_path / "merged"


def _judged_both_ways(root, seed: int):
    """The runs of `_known` read back, and the in-memory and streamed judges' comparisons."""
    from gradalign.judge.compare import compare
    from gradalign.runs.reader import read_run_dir

    base_dir, merged_dir = _known(root, seed)
    base, merged = read_run_dir(base_dir), read_run_dir(merged_dir)
    ref = read_run_dir(base.reference)
    judged = [compare(base, merged, reference=ref, streaming=s) for s in (False, True)]
    return base, merged, ref, judged


# Seeds on which the element near eps showed: 17 where it was found, 59 and 63 on a machine
# whose CPU kernels rounded otherwise (2 of 120 seeds there). Which of them show depends on the
# machine's rounding, so all are read and at least one must.
NEAR_EPS_SEEDS = (17, 59, 63)


def test_adam_near_its_eps_at_the_first_step_is_not_a_false_alarm(tmp_path, monkeypatch):
    """Attention under Adam: one element of the in-projection has a gradient near eps; the
    merged run's summation error there, 6 times the baseline's draw and within the tensor's RMS
    gradient noise, steps it 6 times as far from the reference. Both judges pass it by the
    first step's spread or follow it as a high-gain element (seed 59 here), and failed it
    without both; the same loop with its loss K times too large
    still fails."""
    from gradalign.judge import drift
    from gradalign.judge.compare import compare

    shown = []
    for seed in NEAR_EPS_SEEDS:
        base, merged, ref, judged = _judged_both_ways(tmp_path / f"clean{seed}", seed)
        for c in judged:
            assert c.verdict == "pass", (seed, [d.code for d in c.diagnosis])
        with monkeypatch.context() as without:
            without.setattr(drift, "first_step_spread", lambda gb, *a: np.zeros_like(gb))
            # the element's divergence would also be followed as a high-gain one (gains.py)
            without.setattr("gradalign.judge.honest.follow_gain_divergence", lambda *a: [])
            verdicts = {compare(base, merged, reference=ref, streaming=s).verdict for s in (0, 1)}
        assert len(verdicts) == 1, (seed, verdicts)  # both judges alike
        if verdicts == {"fail"}:
            shown.append(seed)
            for c in judged:  # passed by the first step's spread, or followed as a high gain
                spread = next(d for d in c.results[0].weights if d.name == "mha.in_proj_weight")
                gain = any("the optimizer's gain there" in n for n in c.notes)
                assert (spread.drift and spread.drift > spread.noise) or gain, (seed, c.notes)
    if not shown:
        pytest.skip(f"this machine's rounding took another path on seeds {NEAR_EPS_SEEDS}")
    base_dir, merged_dir = _known(tmp_path / "bug", shown[0], bug=True)
    c = api.compare(base_dir, merged_dir)
    assert c.verdict == "fail" and c.diagnosis[0].code == "loss-scale"


def _diff(name: str, error: float, noise: float, drift: float | None = None, norm=None):
    from gradalign.judge.metrics import TensorDiff

    allowed = 4.0 * noise + (0.0 if drift is None else 4.0 * drift)
    return TensorDiff(
        name, error, 0.0, 0.0, 1.0, error, allowed, noise=noise, drift=drift, norm=norm
    )


def _update(u: int, weights: list, grads: list | None = None):
    from gradalign.judge.results import UpdateResult

    return UpdateResult(u, 1.0, 1.0, 0.0, 0.0, 1.0, weights=weights, grads=grads or [])


def test_a_difference_the_drift_admitted_widens_only_the_updates_after_it():
    """Update 0 admits a weight 12x its noise on the drift: from update 1 on, every tensor
    (other tensors and gradients too) may be 12x its noise; update 0 itself is not widened."""
    from gradalign.judge.noise import carry_admitted_excess

    results = [
        _update(0, [_diff("a", 12.0, 1.0, drift=19.0), _diff("b", 1.0, 1.0)]),
        _update(1, [_diff("a", 12.0, 1.0, drift=19.0), _diff("b", 13.0, 1.0)], [_diff("g", 9, 1)]),
    ]
    before = [d.allowed for d in results[0].weights]
    carry_admitted_excess(results, 4.0)
    assert [d.allowed for d in results[0].weights] == before
    assert all(d.ok for d in (*results[1].weights, *results[1].grads))
    assert results[1].weights[1].allowed == pytest.approx(4.0 + 4.0 * 11.0)


@pytest.mark.parametrize("why", ["failed", "no drift", "within its noise"])
def test_nothing_is_carried_from_an_update_that_failed_or_had_no_drift_to_carry(why):
    from gradalign.judge.noise import carry_admitted_excess

    first = {
        "failed": [_diff("a", 19.0, 1.0, drift=19.0), _diff("c", 9.0, 1.0)],
        "no drift": [_diff("a", 3.9, 1.0)],
        "within its noise": [_diff("a", 0.9, 1.0, drift=19.0)],
    }[why]
    results = [_update(0, first), _update(1, [_diff("b", 13.0, 1.0)])]
    carry_admitted_excess(results, 4.0)
    assert not results[1].weights[0].ok


def test_a_drifted_difference_within_the_factor_is_carried_too():
    """The factor is the margin for one draw: a weight the drift let stand 3.13x its noise
    (model zoo run 6203, an Adam element near eps at its first step) moved the next update's
    output-bias gradient 7.24x its noise. From update 1 on every tensor may be 3.13 times its
    noise, with the factor's margin on top: 7.24x passes, 13x (over 4 x 3.13) still fails."""
    from gradalign.judge.noise import carry_admitted_excess

    results = [
        _update(0, [_diff("w", 3.13, 1.0, drift=5.0)]),
        _update(1, [_diff("w", 1.0, 1.0)], [_diff("bias", 7.24, 1.0), _diff("g", 13.0, 1.0)]),
    ]
    assert not results[1].grads[0].ok
    carry_admitted_excess(results, 4.0)
    assert results[1].grads[0].ok and not results[1].grads[1].ok


def test_a_carried_excess_is_at_most_the_factor_squared():
    """A drifted tensor 3333x its noise (its noise a rounding: the baseline stepped as the
    reference, the merged run's sign flipped; bfloat16 autocast, model zoo run 9011) carries 16:
    later tensors may be 64x their noise, not 13,332x, and a gradient never cleared (200x)
    fails."""
    from gradalign.judge.noise import carry_admitted_excess

    results = [
        _update(0, [_diff("w", 3333.0, 1.0, drift=5000.0)]),
        _update(1, [_diff("w", 1.0, 1.0)], [_diff("bias", 60.0, 1.0), _diff("g", 200.0, 1.0)]),
    ]
    carry_admitted_excess(results, 4.0)
    assert results[1].grads[0].allowed == pytest.approx(4.0 + 4.0 * 15.0)
    assert results[1].grads[0].ok and not results[1].grads[1].ok


@pytest.mark.parametrize("case", ["drifted", "no drift", "beside a large weight"])
def test_a_drifted_modules_relative_distance_bounds_the_next_gradients(case):
    """Update 0's drift admits a weight 2x its noise, 2e-3 of its norm: its elements are not
    the ones the baseline strayed in, so the next gradients may be 2e-3 of their norm off, not
    only 2x their noise (model zoo run 925: 10-20x a sub-ulp noise). A gradient of norm 10 and
    noise 1e-3 may be off by up to 16x its noise (the cap, factor 4): 15x passes and 100x
    fails; the same update's weights, stepped with it, get 15x too. No drift: nothing. A bias
    2e-3 off its own norm beside its module's weight of norm 1e6 is 2e-6 off the module's:
    nothing (an attention key bias, model zoo run 934)."""
    from gradalign.judge.noise import carry_admitted_excess

    w0 = [_diff("lin.bias", 2.0, 1.0, drift=None if case == "no drift" else 3.0, norm=1000.0)]
    if case == "beside a large weight":
        w0.append(_diff("lin.weight", 0.1, 1.0, norm=1e6))
    g1 = [_diff("g", 0.015, 1e-3, norm=10.0), _diff("h", 0.1, 1e-3, norm=10.0)]
    results = [_update(0, w0), _update(1, [_diff("w", 30.0, 1.0, norm=1000.0)], g1)]
    carry_admitted_excess(results, 4.0)
    grad, big = results[1].grads
    widened = case == "drifted"
    assert grad.ok is widened and not big.ok
    assert results[1].weights[0].ok is widened
    if widened:
        assert grad.allowed == pytest.approx(4e-3 + 4.0 * 15.0 * 1e-3)


def test_a_difference_the_carry_let_through_carries_nothing_further():
    """No ratchet: update 1 passes at 50x only by update 0's carried 19x (its own drift admits
    2x), so update 2 is still judged with 19x, and 100x fails."""
    from gradalign.judge.noise import carry_admitted_excess

    results = [
        _update(0, [_diff("a", 19.0, 1.0, drift=19.0)]),
        _update(1, [_diff("a", 50.0, 1.0, drift=2.0)]),
        _update(2, [_diff("a", 100.0, 1.0, drift=2.0)]),
    ]
    carry_admitted_excess(results, 4.0)
    assert results[1].weights[0].ok and not results[2].weights[0].ok


def test_the_first_steps_difference_carried_into_later_updates_is_not_a_false_alarm(tmp_path):
    """Attention under Adam, seed 45: update 0 passes by the first step's spread with its
    in-projection 19x the noise; that element then moves every later gradient and weight, which
    failed at up to 4.5x allowed before the difference was carried. Both judges pass it now;
    the same loop with its loss K times too large still fails as `loss-scale`."""
    for c in _judged_both_ways(tmp_path / "clean", 45)[3]:
        assert c.verdict == "pass", [d.code for d in c.diagnosis]
    base_dir, merged_dir = _known(tmp_path / "bug", 45, bug=True)
    c = api.compare(base_dir, merged_dir)
    assert c.verdict == "fail" and c.diagnosis[0].code == "loss-scale"


def test_an_element_that_drifted_before_counts_its_whole_step_against_the_reference():
    """`noise_steps`: an element whose gradient is no longer noise counts TAU·ρ of its step
    towards what the baseline may stray from its reference, unless it drifted before
    (`carried`): its optimizer state stayed apart (Rprop's step size), so its whole step."""
    from gradalign.judge.drift import TAU, noise_steps

    gr = np.array([1.0, 1.0, 1.0])
    gb = gr + 1e-3  # 0.1% noise: no element dominated
    prev, b, r = np.zeros(3), np.full(3, 0.5), np.full(3, 0.5)
    steps, plain, _ = noise_steps(gb, gr, 1e-3, b, prev, r, prev)
    assert not steps.any() and plain == pytest.approx(3 * (TAU * 1e-3 * 1.0) ** 2)
    carried = np.array([0.0, 0.2, 0.0])
    steps, later, _ = noise_steps(gb, gr, 1e-3, b, prev, r, prev, carried=carried)
    assert not steps.any() and later == pytest.approx(2 * (TAU * 1e-3) ** 2 + 1.0**2)
