"""A failure at a small multiple of its allowance is not a loss scale: on a model of one-element
tensors every gradient is collinear with the baseline's, so any error reads as a "pure scale"."""

from __future__ import annotations

import numpy as np
import pytest

from gradalign import api
from gradalign.runs.portable import write_run
from tests.least_squares import reference_and_baseline

UPDATES, LR, BATCH = 6, 0.2, 16


def train(dtype, *, k: int = 1, scale=None) -> dict:
    """y = a·x + c, both 0-d, MSE and SGD; `scale[u]` multiplies the recorded gradient only."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=UPDATES * BATCH).astype(np.float32).astype(dtype)
    y = (1.5 * x + 0.3 + 0.1 * rng.normal(size=x.size)).astype(np.float32).astype(dtype)
    w = {"a": np.asarray(np.float32(0.1), dtype), "c": np.asarray(np.float32(-0.2), dtype)}
    init = {n: v.copy() for n, v in w.items()}
    snaps, grads, losses = [], [], []
    for u in range(UPDATES):
        acc = {n: np.zeros((), dtype) for n in w}
        for j in range(k):
            rows = slice(u * BATCH + j * BATCH // k, u * BATCH + (j + 1) * BATCH // k)
            err = w["a"] * x[rows] + w["c"] - y[rows]
            losses.append(float((err**2).mean()))
            acc["a"] = (acc["a"] + (2 * err * x[rows]).mean() / k).astype(dtype)
            acc["c"] = (acc["c"] + (2 * err).mean() / k).astype(dtype)
        s = 1.0 if scale is None else scale[u]
        grads.append({n: np.asarray(g * s, dtype) for n, g in acc.items()})
        w = {n: (w[n] - LR * acc[n]).astype(dtype) for n in w}
        snaps.append({n: v.copy() for n, v in w.items()})
    return {
        "init_weights": init,
        "update_weights": snaps,
        "grads": grads,
        "micro_losses": losses,
    }


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("near_one")
    base = reference_and_baseline(root, train)[1]
    clean = api.compare(base, write_run(root / "clean", accum_steps=4, **train(np.float32, k=4)))
    assert clean.verdict == "pass"
    return {"root": root, "base": base, "clean": clean}


def scaled_by(runs, name: str, times: float):
    """The merged run with every recorded gradient off along itself by `times` what the clean
    merged run was allowed there."""
    shares = []
    for r in runs["clean"].results:
        allowed = np.sqrt(sum(d.allowed**2 for d in r.grads))
        size = np.sqrt(sum(d.norm**2 for d in r.grads))
        shares.append(1 + times * allowed / size)
    path = write_run(runs["root"] / name, accum_steps=4, **train(np.float32, k=4, scale=shares))
    return api.compare(runs["base"], path)


def test_a_failure_just_beyond_its_allowance_is_not_named_a_loss_scale(runs):
    result = scaled_by(runs, "marginal", 1.5)
    assert result.verdict == "fail"
    assert "loss-scale" not in [d.code for d in result.diagnosis]


def test_a_scale_well_beyond_its_allowance_is_still_a_loss_scale(runs):
    result = scaled_by(runs, "clear", 8.0)
    assert result.verdict == "fail"
    assert result.diagnosis[0].code == "loss-scale"
