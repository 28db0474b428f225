"""A small tensor's noise, measured on few draws, is bounded from above
(judge/small_noise.few_draws): a 0-d offset's few-ulp rounding failed `golden check` on clean
runs that `compare` passed."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gradalign import api
from gradalign.judge.results import FAIL, PASS
from gradalign.judge.small_noise import DRAWS_CAP, few_draws
from gradalign.runs.portable import write_run

B, N, K, LR = 16, 6, 4, 0.1


def _train(dtype, seed: int, k: int = 1, scale: float = 1.0, rounded_from=None) -> dict:
    """pred = x@W + b + s (s 0-d), MSE, SGD; gradients summed over k micro-batches in `dtype`."""
    rng = np.random.default_rng(100 + seed)
    xs, ys = rng.standard_normal((B * N, 6)), rng.standard_normal((B * N, 3))
    rng = np.random.default_rng(200 + seed)
    start = {"W": rng.standard_normal((6, 3)) * 0.3, "b": rng.standard_normal(3) * 0.1}
    start["s"] = np.array(0.05)
    src = rounded_from or dtype
    p = {n: np.asarray(v).astype(src).astype(dtype) for n, v in start.items()}
    init = {n: v.copy() for n, v in p.items()}
    if rounded_from is not None:
        xs, ys = xs.astype(rounded_from).astype(dtype), ys.astype(rounded_from).astype(dtype)
    losses, weights, grads, mb = [], [], [], B // k
    for u in range(N):
        acc = {n: np.zeros_like(v) for n, v in p.items()}
        for m in range(k):
            rows = slice(u * B + m * mb, u * B + (m + 1) * mb)
            x, y = xs[rows].astype(dtype), ys[rows].astype(dtype)
            r = x @ p["W"] + p["b"] + p["s"] - y
            losses.append(float((r.astype(np.float64) ** 2).mean()))
            d = (2 * r / r.size).astype(dtype)
            g = {"W": x.T @ d, "b": d.sum(0), "s": np.asarray(d.sum(), dtype)}
            for n in acc:
                acc[n] = (acc[n] + g[n] / k).astype(dtype)
        acc = {n: (v * scale).astype(dtype) for n, v in acc.items()}
        grads.append({n: v.copy() for n, v in acc.items()})
        p = {n: (p[n] - LR * acc[n]).astype(dtype) for n in p}
        weights.append({n: v.copy() for n, v in p.items()})
    return dict(
        micro_losses=losses,
        init_weights=init,
        update_weights=weights,
        grads=grads,
        lr=[LR] * N,
        optimizer_steps=[1] * N,
    )


def _runs(root, seed: int, scale: float = 1.0):
    write_run(root / "base", accum_steps=1, reference="../ref", **_train(np.float32, seed))
    ref = _train(np.float64, seed, rounded_from=np.float32)
    write_run(root / "ref", accum_steps=1, dtype="float64", **ref)
    merged = _train(np.float32, seed, k=K, scale=scale)
    write_run(root / "merged", accum_steps=K, **merged)
    golden = api.golden_write(root / "base", root / "golden.json")
    return root / "base", root / "merged", golden


@pytest.mark.parametrize("seed", [0, 3])
def test_a_0d_tensors_few_ulps_pass_golden_check_and_compare(tmp_path, seed):
    """Seeds 0 and 3 failed golden check (`unexplained`, s at 1.59x and 1.02x): the merged
    run's sum of 4 partial gradients rounds a few ulps off a cancelling sum, while the
    baseline's noise over the 6 updates happened to stay under one ulp."""
    base, merged, golden = _runs(tmp_path, seed)
    assert api.golden_check(golden, merged).comparison.verdict == PASS
    assert api.compare(base, merged).verdict == PASS


@pytest.mark.parametrize("scale", [1.0005, 1.00005])
def test_a_gradient_scaled_off_still_fails_golden_check(tmp_path, scale):
    _, merged, golden = _runs(tmp_path, 0, scale)
    assert api.golden_check(golden, merged).comparison.verdict == FAIL


def test_few_draws_bounds_the_noise_as_a_chi_square_does():
    """Against chi-square quantiles at 1% (6 draws: 0.872; 63: 39.86; 441: 374.7)."""
    for draws, quantile in ((6, 0.8721), (63, 39.855), (441, 374.7)):
        assert few_draws(draws) == pytest.approx(math.sqrt(draws / quantile), rel=0.04)
    assert few_draws(1) == few_draws(2) == DRAWS_CAP
    assert [few_draws(n) for n in (7, 14, 64)] == sorted([few_draws(n) for n in (7, 14, 64)])[::-1]
