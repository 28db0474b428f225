"""A loop that adds a term to `.grad` once per update in both runs (gradient noise seeded by
the update, a penalty added by hand) and forgets to divide its loss by K: the gradient is K
times the baseline's plus the same term, turned a little, and is named `loss-scale` beside that
term (it was `cross-sample-loss`); with the loss divided it passes. A merged gradient whose
norm stands K times the baseline's, turned, at one update alone is no scale (model zoo run
284117): unexplained, where the same size kept from there on is named."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from gradalign.judge.compare import compare
from gradalign.runs.reader import read_run_dir

from .conftest import write_w_run
from .recorded_loop import train

BATCH, K = 32, 4


def noisy_loop(out, k: int, scale: float = 1.0, sigma: float = 1e-3, float64: bool = False):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(20, 32), nn.Tanh(), nn.Linear(32, 5))
    g = torch.Generator().manual_seed(11)
    x = torch.randn(8 * BATCH, 20, generator=g)
    y = x[:, :5].argmax(1)
    if float64:
        model, x = model.double(), x.double()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def noise(update: int, micro: int) -> None:
        if micro == 0:  # into the zeroed .grad: once per update, the same in both runs
            draw = torch.Generator().manual_seed(1000 + update)
            for p in model.parameters():
                p.grad.add_(torch.randn(p.shape, generator=draw).to(p.dtype) * sigma)

    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    train(out, model, opt, x, y, k, batch=BATCH, scale=scale, before_micro=noise, set_to_none=False)
    return read_run_dir(out)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("added")
    return {
        "base": noisy_loop(root / "base", 1),
        "ref": noisy_loop(root / "ref", 1, float64=True),
        "clean": noisy_loop(root / "clean", K),
        "bug": noisy_loop(root / "bug", K, scale=K),
    }


@pytest.mark.parametrize("reference", [True, False])
def test_a_scale_beside_a_term_added_to_grad_is_named(runs, reference):
    ref = runs["ref"] if reference else None
    assert compare(runs["base"], runs["clean"], reference=ref).verdict == "pass"
    c = compare(runs["base"], runs["bug"], reference=ref)
    first = c.diagnosis[0]
    assert first.code == "loss-scale", [(d.code, d.message) for d in c.diagnosis]
    assert first.evidence["expected_ratio"] == K
    assert "a term added to the gradient alike in both runs" in first.message


SHAPE, UPDATES, LR, TURN = (16, 16), 8, 1e-2, 4


def _turned(g: np.ndarray, rng, size: float) -> np.ndarray:
    """`g` plus a direction orthogonal to it of `size` times its norm."""
    o = rng.normal(size=g.shape)
    o -= (o.ravel() @ g.ravel()) / (g.ravel() @ g.ravel()) * g
    return g + o * (size * np.linalg.norm(g) / np.linalg.norm(o))


def _judged(tmp_path, kept: bool):
    """Runs written with numpy, K=2: the merged gradient from update TURN on the baseline's plus
    an orthogonal part, its norm 2 times the baseline's at TURN and, `kept`, at every update
    after (else 1.35 times)."""
    rng = np.random.default_rng(0)
    init = rng.normal(size=SHAPE) * 0.1
    grads = [rng.normal(size=SHAPE) * 0.1 for _ in range(UPDATES)]
    weights = list(init - LR * np.cumsum(grads, axis=0))
    write_w_run(tmp_path / "ref", 1, init.astype(np.float32).astype(np.float64), weights, grads)

    def run(name: str, k: int, seed: int):
        own = np.random.default_rng(seed)
        ws, gs = [], []
        for u in range(UPDATES):
            g = grads[u] + own.normal(size=SHAPE) * 1e-6
            if k > 1 and u >= TURN:
                g = _turned(g, own, np.sqrt(3.0) if kept or u == TURN else 0.9)
            ws.append((weights[u] + own.normal(size=SHAPE) * 1e-9).astype(np.float32))
            gs.append(g.astype(np.float32))
        return read_run_dir(write_w_run(tmp_path / name, k, init.astype(np.float32), ws, gs))

    base, merged = run("base", 1, 1), run("merged", 2, 2)
    return compare(base, merged, reference=read_run_dir(tmp_path / "ref"))


def test_a_norm_k_times_the_baselines_at_one_update_alone_is_no_scale(tmp_path):
    once = _judged(tmp_path / "once", kept=False)
    assert once.verdict == "fail" and once.diagnosis[0].code == "unexplained"
    kept = _judged(tmp_path / "kept", kept=True)
    assert kept.diagnosis[0].code == "loss-scale"
    assert kept.diagnosis[0].evidence["expected_ratio"] == 2
