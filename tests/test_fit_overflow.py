"""A gradient that overflowed in one run (a 16-bit one: inf) on tensors whose products with the
baseline's have opposite signs: the ratio fit over all gradients is inf − inf, NaN, in both
judges alike. The streamed judge added the tensors' sums with math.fsum, which raised there
("-inf + inf in fsum", exit 3 "internal error": model zoo run 202007, a GRU under Rprop, float16
autocast, the step taken every micro-step)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gradalign.judge.compare import compare
from gradalign.runs.portable import write_run
from gradalign.runs.reader import read_run_dir

UPDATES, K = 3, 2


def _run(root, name: str, k: int, overflow: bool):
    rng = np.random.default_rng(0)
    w = {"a": np.ones(4, np.float32), "b": -np.ones(4, np.float32)}
    init, weights, grads = {n: v.copy() for n, v in w.items()}, [], []
    for u in range(UPDATES):
        g = {n: (v * 0.1 + rng.normal(0, 1e-3, 4)).astype(np.float32) for n, v in w.items()}
        if (
            overflow and u == 1
        ):  # +inf where the baseline's a > 0 and its b < 0: a·m = +inf, b·m = −inf
            g["a"][0], g["b"][0] = np.inf, np.inf
        w = {
            n: (v - 0.1 * np.nan_to_num(g[n], posinf=0.0)).astype(np.float32) for n, v in w.items()
        }
        weights.append({n: v.copy() for n, v in w.items()})
        grads.append(g)
    losses = np.full(UPDATES * k, 1.0, np.float32)
    return write_run(
        root / name, accum_steps=k, micro_losses=losses, init_weights=init,
        update_weights=weights, grads=grads,
    )  # fmt: skip


@pytest.mark.parametrize("streaming", [False, True])
def test_an_overflowed_gradient_fits_to_nan_in_both_judges(tmp_path, streaming):
    base = read_run_dir(_run(tmp_path, "base", 1, False))
    merged = read_run_dir(_run(tmp_path, "merged", K, True))
    c = compare(base, merged, reference=None, streaming=streaming)
    assert c.verdict == "fail"
    at = c.results[1]
    assert math.isnan(at.grad_ratio) and math.isnan(at.grad_cosine), (at.grad_ratio, at.grad_cosine)
    assert all(math.isfinite(r.grad_ratio) for r in c.results if r.update != 1)
