"""Weights a log prints after each update, numpy's default print, for a float32 MLP trained on
a batch of B and as K=4 micro-batches of B/4: the sums in another order leave the weights a few
float32 spacings apart after some updates. Judged element by element against their print
resolutions alone, most clean pairs failed (17 of 30 in a hunt); the excess beyond the
resolutions is judged now against the distance training moved the weights since their first
print, as recorded weights are, and a step inside the window still fails."""

from __future__ import annotations

import numpy as np
import pytest

from gradalign import api

B, K, UPDATES, HIDDEN, LR = 32, 4, 40, 32, np.float32(0.5)


def _train(seed: int, k: int, step_inside: bool = False) -> tuple[list[float], list[np.ndarray]]:
    """Window losses and the first layer after each update (float32, SGD, tanh MLP)."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(B * UPDATES, 16)).astype(np.float32)
    y = rng.integers(0, 4, size=B * UPDATES)
    w1 = (rng.normal(size=(16, HIDDEN)) * 0.3).astype(np.float32)
    w2 = (rng.normal(size=(HIDDEN, 4)) * 0.3).astype(np.float32)
    losses, printed, n = [], [], B // k
    for u in range(UPDATES):
        g1, g2 = np.zeros_like(w1), np.zeros_like(w2)
        for j in range(k):
            rows = slice(u * B + j * n, u * B + (j + 1) * n)
            h = np.tanh(x[rows] @ w1)
            z = h @ w2
            p = np.exp(z - z.max(1, keepdims=True))
            p /= p.sum(1, keepdims=True)
            losses.append(float(-np.log(p[np.arange(n), y[rows]]).mean()))
            dz = p.copy()
            dz[np.arange(n), y[rows]] -= 1
            dz /= n * k
            g2 += h.T @ dz
            g1 += x[rows].T @ ((dz @ w2.T) * (1 - h**2))
            if step_inside and j < k - 1:
                w1, w2 = w1 - LR * g1, w2 - LR * g2
                g1, g2 = np.zeros_like(w1), np.zeros_like(w2)
        w1, w2 = w1 - LR * g1, w2 - LR * g2
        printed.append(w1.copy())
    return losses, printed


def _log(path, seed: int, k: int, step_inside: bool = False) -> tuple[str, list[np.ndarray]]:
    losses, printed = _train(seed, k, step_inside)
    lines = []
    for u in range(UPDATES):
        lines += [f"{u * k + j}   {losses[u * k + j]:.8f}" for j in range(k)]
        lines.append(str(printed[u]))
    path.write_text("\n".join(lines) + "\n")
    return str(path), printed


@pytest.mark.parametrize("seed", range(6))
def test_printed_weights_a_few_spacings_apart_pass(tmp_path, seed):
    base, wb = _log(tmp_path / "base.log", seed, 1)
    merged, wm = _log(tmp_path / "merged.log", seed, K)
    c = api.compare(base, merged, accum_steps=K)
    assert c.verdict == "pass", [(d.code, d.message) for d in c.diagnosis]
    assert not any("nothing was trained" in note for note in c.notes)
    if seed == 1:  # the pairs do stand apart beyond one float32 spacing of their largest value
        spacings = [
            np.abs(m - b).max() / np.spacing(np.abs(b).max()) for b, m in zip(wb, wm, strict=True)
        ]
        assert max(spacings) > 1


def test_printed_weights_of_a_step_inside_the_window_still_fail(tmp_path):
    base, _ = _log(tmp_path / "base.log", 0, 1)
    merged, _ = _log(tmp_path / "merged.log", 0, K, step_inside=True)
    c = api.compare(base, merged, accum_steps=K)
    assert c.verdict == "fail"
    assert {ch.name: ch.status for ch in c.checks}["weights (printed values only)"] == "fail"
