"""The noise model (judge/noise.py) on runs written with numpy: an isolated, localized gradient
jump is noted, not failed, while a spread one, or one that repeats, still fails; the drift of
noise-dominated elements under Adam widens the floor only where the gradient is noise."""

from __future__ import annotations

import numpy as np
import pytest

from gradalign import api
from gradalign.runs.portable import write_run

ROWS, COLS, UPDATES, LR = 40, 6, 12, 0.1


def data(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(UPDATES * 16, COLS))
    return x, x @ rng.normal(size=(COLS, ROWS)) * 0.1


def train(dtype, *, k: int = 1, spike=None) -> dict:
    """Linear least squares, SGD. `spike(update, grad)` alters the recorded gradient only (an
    activation crossing its kink in one run changes one unit's gradient at one update)."""
    x, y = (v.astype(np.float32).astype(dtype) for v in data())
    # float32 initial weights for every run: the float64 reference starts from the same values
    w = (np.random.default_rng(1).normal(size=(ROWS, COLS)) * 0.1).astype(np.float32).astype(dtype)
    init = {"w": w.copy()}
    snaps, grads, losses = [], [], []
    for u in range(UPDATES):
        g_sum = np.zeros_like(w)
        for j in range(k):
            rows = slice(u * 16 + j * 16 // k, u * 16 + (j + 1) * 16 // k)
            err = x[rows] @ w.T - y[rows]
            losses.append(float((err**2).mean()))
            g_sum += (2 * err.T @ x[rows] / err.size * ROWS).astype(dtype)
        g = (g_sum / k).astype(dtype)
        recorded = spike(u, g.copy()) if spike else g
        grads.append({"w": recorded})
        w = (w - LR * g).astype(dtype)
        snaps.append({"w": w.copy()})
    return {"init_weights": init, "update_weights": snaps, "grads": grads, "micro_losses": losses}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("noise")
    ref = write_run(root / "ref", accum_steps=1, **train(np.float64))
    base = write_run(root / "base", accum_steps=1, reference="../ref", **train(np.float32))
    return {"root": root, "base": base, "ref": ref}


def merged(runs, name: str, spike) -> object:
    path = write_run(runs["root"] / name, accum_steps=4, **train(np.float32, k=4, spike=spike))
    return api.compare(runs["base"], path)


def one_row(update: int):
    def spike(u, g):
        if u == update:
            g[3] += 1e-3 * np.abs(g).max()  # one unit's row, one update
        return g

    return spike


def test_an_isolated_localized_jump_is_noted_not_failed(runs):
    result = merged(runs, "jump", one_row(6))
    assert result.verdict == "pass", [c for c in result.checks if c.status == "fail"]
    assert any("update 6: the gradient of w jumped" in note for note in result.notes)
    assert [d.excused for d in result.results[6].grads] == ["isolated jump"]


def test_a_spread_jump_still_fails(runs):
    def spread(u, g):
        return g * (1 + 1e-3) if u == 6 else g

    result = merged(runs, "spread", spread)
    assert result.verdict == "fail"
    assert not any("jumped" in note for note in result.notes)


def test_a_jump_at_two_updates_in_a_row_still_fails(runs):
    def twice(u, g):
        return one_row(u)(u, g) if u in (6, 7) else g

    result = merged(runs, "twice", twice)
    assert result.verdict == "fail"


def test_a_clean_run_needs_no_excuse(runs):
    result = merged(runs, "clean", None)
    assert result.verdict == "pass"
    assert all(d.excused is None for r in result.results for d in r.grads)


@pytest.mark.parametrize(("error", "said"), [(3.0, False), (500.0, True)])
def test_pass_message_says_when_the_rounding_floor_allowed_more_than_the_factor(error, said):
    from types import SimpleNamespace as NS

    from gradalign.judge.diagnose import _why_it_passes

    tensor = NS(ratio=0.5, error=error, noise=1.0)
    c = NS(
        results=[NS(weights=[tensor], grads=[])],
        reference="ref",
        tolerances=NS(noise_factor=4.0),
        dtype="float32",
        merged=NS(model_facts={}),
    )
    message = _why_it_passes(c)[0].message
    assert f"{error:.2g}x as far" in message and "(allowed 4x" in message
    assert ("one rounding of the tensor" in message) == said


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
