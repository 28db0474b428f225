"""The noise model (judge/noise.py) on the least-squares runs (tests/least_squares.py): an
isolated, localized gradient jump is noted, not failed, while a spread one still fails; a
reference is kept where the baseline's gradient noise explains it and refused, saying why, where
it saw other samples; a loss is known to its own rounding, to what the passing weights before it
explain, and its noise is pooled update by update."""

from __future__ import annotations

import numpy as np
import pytest

from gradalign import api
from gradalign.runs.portable import write_run

from . import least_squares
from .least_squares import UPDATES, merged, one_row, train

runs = least_squares.runs  # the fixture, shared


def test_an_isolated_localized_jump_is_noted_not_failed(runs):
    result = merged(runs, "jump", one_row(6))
    assert result.verdict == "pass", [c for c in result.checks if c.status == "fail"]
    assert any("update 6: the gradient of w jumped" in note for note in result.notes)
    assert [d.excused for d in result.results[6].grads] == ["isolated jump"]


def test_an_isolated_jump_in_one_column_is_noted_not_failed(runs):
    """A unit at its kink feeds the next layer: its jump fills that layer's column (a mostly
    dead ReLU net's output weight, 17.6x in one column and nowhere else)."""

    def column(u, g):
        if u == 6:
            g[:, 2] += 1e-3 * np.abs(g).max()
        return g

    result = merged(runs, "column", column)
    assert result.verdict == "pass", [c for c in result.checks if c.status == "fail"]
    assert any("1 row(s) or column(s) of w" in note for note in result.notes)


def test_a_spread_jump_still_fails(runs):
    def spread(u, g):
        return g * (1 + 1e-3) if u == 6 else g

    result = merged(runs, "spread", spread)
    assert result.verdict == "fail"
    assert not any("jumped" in note for note in result.notes)


def test_jumps_in_a_row_whose_steps_stay_in_the_noise_are_noted(runs):
    """Jumps at consecutive updates, in the same unit, whose steps leave every weight within its
    noise (recorded apart from the step here; under Adam a unit's one-sample jump moves its
    step by a sliver): a unit hovering at its kink flips in one run at update after update
    (model zoo run 1252 at width 8, unit 191 at updates 7, 8 and 9), and the training is the
    same within rounding."""

    def thrice(u, g):
        return one_row(u)(u, g) if u in (6, 7, 8) else g

    result = merged(runs, "thrice-quiet", thrice)
    assert result.verdict == "pass", [c for c in result.checks if c.status == "fail"]
    assert [result.results[u].grads[0].excused for u in (6, 7, 8)] == ["isolated jump"] * 3
    assert any("its step left every weight within its noise" in n for n in result.notes)


def test_a_clean_run_needs_no_excuse(runs):
    result = merged(runs, "clean", None)
    assert result.verdict == "pass"
    assert all(d.excused is None for r in result.results for d in r.grads)


@pytest.mark.parametrize(("error", "said"), [(3.0, False), (500.0, True)])
def test_pass_message_says_when_the_rounding_floor_allowed_more_than_the_factor(error, said):
    from types import SimpleNamespace as NS

    from gradalign.judge.passing import why_it_passes

    tensor = NS(name="w", ratio=0.5, error=error, noise=1.0, excused=None)
    c = NS(
        results=[NS(update=3, weights=[tensor], grads=[])],
        reference=NS(dtype="float64"),
        tolerances=NS(noise_factor=4.0),
        dtype="float32",
        merged=NS(model_facts={}),
    )
    message = why_it_passes(c)[0].message
    assert f"{error:.2g}x as far" in message
    assert ("(allowed 4x)" in message) != said
    assert ("beyond 4x where the noise model says why: one rounding" in message) == said
    assert ("at w (update 3), which stands at 0.5x what it is allowed" in message) == said


@pytest.mark.parametrize("noisy", [False, True])
def test_the_streamed_judge_keeps_a_reference_the_baselines_gradient_noise_explains(
    tmp_path, noisy
):
    """Run directories on disk (the streamed judge): the reference steps every element by δ
    along a gradient of one size; the baseline steps a 10-element bias by 1.2·δ, 20% of its
    distance moved. Refused when the gradients agree; kept when the bias's gradient is 1.2
    times the reference's, which explains its steps (test_diagnose.py holds the whole-tensor
    judge to the same). A large tensor that agrees keeps the model's gradients within 1%."""
    from gradalign.errors import BadInput

    shapes = {"big": (1000, 100), "bias": (10,)}
    start = {
        n: (np.random.default_rng(2).normal(size=s) * 0.1).astype(np.float32)
        for n, s in shapes.items()
    }
    pattern = {
        n: np.where(np.arange(v.size) % 3 == 0, -1.0, 1.0).reshape(v.shape)
        for n, v in start.items()
    }

    def run(dtype, step, grad, k=1):
        scale = {"big": 1.0, "bias": step}
        return {
            "init_weights": {n: v.astype(dtype) for n, v in start.items()},
            "update_weights": [
                {
                    n: (start[n] + scale[n] * (u + 1) * 1e-3 * pattern[n]).astype(dtype)
                    for n in start
                }
                for u in range(UPDATES)
            ],
            "grads": [
                {
                    "big": pattern["big"].astype(dtype),
                    "bias": (grad * pattern["bias"]).astype(dtype),
                }
                for _ in range(UPDATES)
            ],
            "micro_losses": [1.0] * (UPDATES * k),
        }

    write_run(tmp_path / "ref", accum_steps=1, **run(np.float64, 1.0, 1.0))
    grad = 1.2 if noisy else 1.0
    base = write_run(
        tmp_path / "base", accum_steps=1, reference="../ref", **run(np.float32, 1.2, grad)
    )
    merged = write_run(tmp_path / "merged", accum_steps=4, **run(np.float32, 1.2, grad, k=4))
    if noisy:
        assert api.compare(base, merged).verdict == "pass"
    else:
        with pytest.raises(BadInput, match="not a rerun of the baseline's training: at update 0"):
            api.compare(base, merged)


@pytest.mark.parametrize("scale, passes", [(1.0, True), (1.1, False)])
def test_a_loss_computed_under_autocast_is_known_to_its_own_rounding(tmp_path, scale, passes):
    """Under bfloat16 autocast a loss of 21 is a multiple of 0.125 where it is computed; the
    merged window mean of 21 and 21.25 is one such step from the baseline's 21, which here sits
    on the reference exactly (model zoo run 9231, a GPT under Adamax with --autocast, failed as
    `loss-averaging` so). The loss is judged to the compute dtype's rounding: that passes,
    while losses recorded 1.1 times too large still fail."""
    ref = train(np.float64)
    ref["micro_losses"] = [21.0] * UPDATES
    write_run(tmp_path / "ref", accum_steps=1, **ref)
    base = train(np.float32)
    base["micro_losses"] = [21.0] * UPDATES
    b = write_run(
        tmp_path / "base", accum_steps=1, reference="../ref", compute_dtype="bfloat16", **base
    )
    merged = train(np.float32, k=4)
    merged["micro_losses"] = [scale * v for v in [21.0, 21.25] * (2 * UPDATES)]
    m = write_run(tmp_path / "merged", accum_steps=4, compute_dtype="bfloat16", **merged)
    result = api.compare(b, m)
    assert all(r.loss_ok for r in result.results) == passes
    assert (result.verdict == "pass") == passes, [c.detail for c in result.checks]


@pytest.mark.parametrize(
    ("compute", "losses", "scale", "passes"),
    [
        ("bfloat16", [21.0, 21.25], 1.0, True),  # one step of 0.125 apart: its rounding
        ("bfloat16", [21.0, 21.25], 1.1, False),  # losses recorded 1.1 times too large
        ("float32", [21.0, 21.25], 1.0, False),  # float32 losses: no rounding to allow
        # bfloat16 numbers plus a term each window holds (a float32 penalty): loss_steps.py
        ("bfloat16", [21.0 + 2**-12, 21.25 + 2**-12], 1.0, True),
        ("bfloat16", [21.0 + 2**-12, 21.25 + 2**-11], 1.0, False),  # nor one term from them
        ("float16", [1.8193359375, 1.8212890625], 1.0, True),  # two steps of float16 near 1.8
    ],
)
def test_without_a_reference_a_loss_is_known_to_the_rounding_of_its_compute_dtype(
    tmp_path, compute, losses, scale, passes
):
    """With --reference none the fixed loss tolerance (bfloat16: 1e-3 relative) was tighter
    than one step of a loss computed in bfloat16 (0.125 near 21): zoo run 9231 failed so. A
    loss whose every recorded value is a number of the 16-bit compute dtype may differ by the
    noise factor times its epsilon, relative, and so may one that is such a number plus a term
    each window holds constant (the differences inside a window fall on its grid); float32
    losses, or values that dtype cannot hold, get nothing more."""
    base = train(np.float32)
    base["micro_losses"] = [losses[0]] * UPDATES
    b = write_run(tmp_path / "base", accum_steps=1, compute_dtype=compute, **base)
    merged = train(np.float32, k=4)
    merged["micro_losses"] = [scale * v for v in losses * (2 * UPDATES)]
    m = write_run(tmp_path / "merged", accum_steps=4, compute_dtype=compute, **merged)
    result = api.compare(b, m, reference="none")
    assert all(r.loss_ok for r in result.results) == passes


def test_a_loss_may_differ_by_what_the_passing_weights_before_it_explain():
    """Update u's loss is computed with the weights after u-1: where those passed and the loss
    alone failed, it may differ by factor times the larger slope along the step between the
    two runs' weights, |<g_ref(u), d>| or |<g_m(u), d>| with d = w_m(u-1) - w_ref(u-1) (the
    zoo's runs 2062 and 7313 hold it end to end where the machine's rounding takes that path).
    Weights that failed explain nothing, and a passing loss is left alone."""
    from types import SimpleNamespace

    from gradalign.judge.metrics import TensorDiff
    from gradalign.judge.noise import explain_loss_by_weights
    from gradalign.judge.results import UpdateResult

    g_ref, g_merged = np.array([[1.0, -2.0], [0.5, 0.0]]), np.array([[1.0, -2.0], [0.5, 1e-3]])
    w_ref, w_merged = np.zeros((2, 2)), np.array([[1e-3, 2e-3], [4e-3, 7.0]])
    at_ref = abs(float((g_ref * (w_merged - w_ref)).sum()))  # 1e-3 - 4e-3 + 2e-3 = 1e-3
    at_merged = abs(float((g_merged * (w_merged - w_ref)).sum()))  # 1e-3 + 7e-3 = 8e-3
    ref = SimpleNamespace(grads=lambda u: {"w": g_ref}, weights=lambda u: {"w": w_ref})

    def results(weights_ok: bool, loss_error: float) -> list[UpdateResult]:
        w = TensorDiff("w", 0, 0, 0, 1, 1.0 if weights_ok else 3.0, 2.0)
        return [UpdateResult(u, 1, 1, 0, loss_error, 1e-4, weights=[w]) for u in range(2)]

    for grads, slope in (({"w": g_merged}, at_merged), (None, at_ref)):  # None: none kept
        merged = SimpleNamespace(weights=lambda u: {"w": w_merged}, grads=lambda u, g=grads: g)
        explained = results(True, 2e-3)
        explain_loss_by_weights(explained, merged, ref, 4.0)
        assert explained[1].loss_allowed == pytest.approx(1e-4 + 4.0 * slope)
        assert explained[1].loss_ok and explained[0].loss_allowed == 1e-4
        for weights_ok, loss_error in ((False, 2e-3), (True, 5e-5)):
            left = results(weights_ok, loss_error)
            explain_loss_by_weights(left, merged, ref, 4.0)
            assert left[1].loss_allowed == 1e-4


def _pooled(size: int, noises: list[float], error: float) -> list[bool]:
    """Each update's gradient verdict after pooling: one tensor of `size` elements whose noise
    is `noises`, the merged run `error` off at update 0 and at its noise after."""
    from gradalign.judge.metrics import TensorDiff
    from gradalign.judge.noise import pool_noise
    from gradalign.judge.results import UpdateResult

    def diff(noise: float, err: float) -> TensorDiff:
        return TensorDiff("w", err, 0.0, 0.0, 1.0, err, 4 * noise, noise=noise, size=size)

    results = [UpdateResult(u, 1.0, 1.0, 0.0, 0.0, 1.0) for u in range(len(noises))]
    for u, (r, noise) in enumerate(zip(results, noises, strict=True)):
        r.grads.append(diff(noise, error if u == 0 else noise))
    pool_noise(results, 4.0)
    return [r.grads[0].ok for r in results]


def test_a_tensor_of_many_elements_pools_no_later_noise_into_its_first_update():
    """bfloat16 runs part after update 0, and their noise grows 10x: pooled over the updates
    after, update 0's allowance grew past a token-normalization bug's error there (allowed
    1.0e-3 on a measured noise of 1.1e-5; a float64 reference passed it). A tensor of a few
    elements still pools both ways: one update's noise is a poor estimate of its own."""
    growing = [1.0, 10.0, 10.0, 10.0]
    assert _pooled(4096, growing, error=8.0) == [False, True, True, True]
    assert _pooled(4, growing, error=8.0) == [True, True, True, True]


def test_a_reference_that_saw_other_samples_is_refused_with_the_likely_cause(tmp_path):
    """Inputs transformed in the loop ((x - mean) / std) in the model's dtype are other bits in a
    float64 rerun: its sample digests differ, and the refusal now says why that happens."""
    digests = np.arange(1, UPDATES + 1, dtype=np.int64)
    write_run(tmp_path / "ref", accum_steps=1, micro_data=digests + 1, **train(np.float64))
    base = write_run(
        tmp_path / "base",
        accum_steps=1,
        reference="../ref",
        micro_data=digests,
        **train(np.float32),
    )
    other = write_run(tmp_path / "other", accum_steps=1, micro_data=digests, **train(np.float32))
    from gradalign.errors import BadInput

    match = r"saw other samples than the baseline .*float64 rerun.*transform them in float32"
    with pytest.raises(BadInput, match=match):
        api.compare(base, other)


def test_one_updates_loss_error_does_not_widen_every_updates_allowance(tmp_path):
    """The baseline's loss error against the reference is pooled over the run as a lower bound;
    one update's error 40,000 times the others' (a loss recorded otherwise there, a hand-edited
    golden) widened every update's loss allowance by as much. It widens its own update only."""
    ref = train(np.float64)
    ref["micro_losses"][5] *= 1.01  # one update's loss, 1% off
    write_run(tmp_path / "ref", accum_steps=1, **ref)
    base = write_run(tmp_path / "base", accum_steps=1, reference="../ref", **train(np.float32))
    merged = write_run(tmp_path / "merged", accum_steps=4, **train(np.float32, k=4))
    result = api.compare(base, merged)
    allowed = [r.loss_allowed / abs(r.base_loss) for r in result.results]
    assert allowed[5] > 1e-3
    assert max(a for u, a in enumerate(allowed) if u != 5) < 1e-4, allowed


@pytest.mark.parametrize("broken", ["loss", "gradient"])
def test_a_reference_gone_non_finite_is_refused_saying_so(tmp_path, broken):
    """A float64 rerun whose loss (or first gradient) is NaN where the baseline's is finite (a
    mask filled with the dtype's extreme value, as a transformers model's sliding window was in
    float64) was refused as "inf away" from the baseline, with a hint about random draws."""
    from gradalign.errors import BadInput

    rng = np.random.default_rng(0)
    start = {"w": rng.normal(size=(4, 3)).astype(np.float32)}
    grad = {"w": rng.normal(size=(4, 3))}

    def run(dtype, k=1, nan=False):
        bad = nan and broken == "gradient"
        return {
            "init_weights": {"w": start["w"].astype(dtype)},
            "update_weights": [
                {"w": (start["w"] - 0.1 * (u + 1) * grad["w"]).astype(dtype)}
                for u in range(UPDATES)
            ],
            "grads": [
                {"w": (np.full((4, 3), np.nan) if bad and u == 0 else grad["w"]).astype(dtype)}
                for u in range(UPDATES)
            ],
            "micro_losses": [np.nan if nan and broken == "loss" else 1.0] * (UPDATES * k),
        }

    write_run(tmp_path / "ref", accum_steps=1, **run(np.float64, nan=True))
    base = write_run(tmp_path / "base", accum_steps=1, reference="../ref", **run(np.float32))
    merged = write_run(tmp_path / "merged", accum_steps=4, **run(np.float32, k=4))
    said = "not finite where the baseline is: " + (
        "its loss at update 0 is nan" if broken == "loss" else "its gradient of w at update 0"
    )
    with pytest.raises(BadInput, match=said):
        api.compare(base, merged)
