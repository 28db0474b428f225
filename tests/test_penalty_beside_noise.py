"""A weight penalty counted K times in a run whose gradients carry wide noise (bfloat16): the
merged gradient exceeds the baseline's by 2·λ·(K−1) times the weights, which shows in a tensor
whose weights are large beside its gradient's noise (a norm's gain) and is lost in one whose
weights are small beside it (a convolution's). The second holds most of the difference's energy,
so a fit over all the gradients together explains little of it; measured in units of each
gradient's noise it explains most, every tensor's rest within its check (model zoo run 184515,
a ResNet under Adagrad, bfloat16 autocast: 29% explained together, 83% in units of the noise,
`unexplained` before; judge/signatures/accumulation.py, `_share_in_noise`).

The runs are written with numpy (gradalign.runs.portable): SGD on fixed true gradients with the
penalty's gradient 2·λ·w, each float32 run's own noise, the float64 reference none."""

from __future__ import annotations

import numpy as np
import pytest

from gradalign import api
from gradalign.runs.portable import write_run

UPDATES, K, LR, L2 = 5, 2, 0.01, 1e-3
SIZES = {"norm.weight": 64, "conv.weight": 2000}
GRADIENT = {"norm.weight": 0.1, "conv.weight": 10.0}  # each true gradient's norm
NOISE = {"norm.weight": 0.01, "conv.weight": 0.05}  # each run's noise, a share of it


def _start() -> dict[str, np.ndarray]:
    """The initial weights, float32 values (every run starts from the same model)."""
    rng = np.random.default_rng(7)
    w = {"norm.weight": np.ones(64), "conv.weight": rng.normal(size=2000) * 0.01}
    return {name: v.astype(np.float32).astype(np.float64) for name, v in w.items()}


def _true(name: str, u: int) -> np.ndarray:
    g = np.random.default_rng(100 * u + SIZES[name]).normal(size=SIZES[name])
    return g * GRADIENT[name] / np.linalg.norm(g)


def _sgd(dtype, seed: int | None, k: int = 1, bug: str | None = None) -> dict:
    """SGD on the true gradients plus the penalty's 2·λ·w and this run's noise (`seed`; None:
    none); `bug`: "penalty" adds it K times from update 2 on, "stray" adds a stray gradient of
    the same size to the norm's gain there instead (no multiple of the weights)."""
    rng = None if seed is None else np.random.default_rng(seed)
    w = _start()
    snaps, grads = [], []
    for u in range(UPDATES):
        g = {}
        for name, v in w.items():
            g[name] = _true(name, u) + 2 * L2 * v
            if bug == "penalty" and u >= 2:
                g[name] = g[name] + 2 * L2 * (k - 1) * v
            if bug == "stray" and u >= 2 and name == "norm.weight":
                stray = np.random.default_rng(u).normal(size=v.size)
                g[name] = g[name] + stray * np.linalg.norm(2 * L2 * (k - 1) * v) / np.sqrt(v.size)
            if rng is not None:
                share = NOISE[name] * GRADIENT[name] / np.sqrt(v.size)
                g[name] = g[name] + rng.normal(size=v.size) * share
        w = {name: v - LR * g[name] for name, v in w.items()}
        grads.append({name: v.astype(dtype) for name, v in g.items()})
        snaps.append({name: v.astype(dtype) for name, v in w.items()})
    return {
        "init_weights": {name: v.astype(dtype) for name, v in _start().items()},
        "update_weights": snaps,
        "grads": grads,
        "micro_losses": [1.0 - 0.01 * u for u in range(UPDATES) for _ in range(k)],
        "optimizer_steps": [1] * UPDATES,
    }


def _compare(tmp_path, seed: int, bug: str):
    write_run(tmp_path / "ref", accum_steps=1, **_sgd(np.float64, None))
    sixteen = {"compute_dtype": "bfloat16"}  # noise as wide as bfloat16's
    base = _sgd(np.float32, 2 * seed)
    base = write_run(tmp_path / "base", accum_steps=1, reference="../ref", **sixteen, **base)
    merged = _sgd(np.float32, 2 * seed + 1, K, bug)
    return api.compare(base, write_run(tmp_path / "merged", accum_steps=K, **sixteen, **merged))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_penalty_counted_k_times_beside_wide_noise_is_named(tmp_path, seed):
    """`penalty-not-scaled` at update 2, its coefficient read in units of the noise (λ/2 ≈
    5e-4 written as c·‖w‖²); without `_share_in_noise` it is `unexplained` (a mutation there
    fails here)."""
    c = _compare(tmp_path, seed, "penalty")
    assert c.verdict == "fail"
    first = c.diagnosis[0]
    assert first.code == "penalty-not-scaled", [d.message for d in c.diagnosis]
    assert first.evidence["update"] == 2
    assert first.evidence["implied_l2"] == pytest.approx(L2, rel=0.2)
    assert "in units of each gradient's noise" in first.message


@pytest.mark.parametrize("seed", [0, 1])
def test_a_stray_gradient_as_large_is_not_a_penalty(tmp_path, seed):
    """A stray gradient of the same size in the norm's gain, no multiple of its weights: it
    fails, and not as `penalty-not-scaled`."""
    c = _compare(tmp_path, seed, "stray")
    assert c.verdict == "fail"
    assert "penalty-not-scaled" not in [d.code for d in c.diagnosis]
