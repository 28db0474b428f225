"""A loop that adds a term to `.grad` once per update in both runs (gradient noise seeded by
the update, a penalty added by hand) and forgets to divide its loss by K: the gradient is K
times the baseline's plus the same term, turned a little, and is named `loss-scale` beside that
term (it was `cross-sample-loss`); with the loss divided it passes."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from gradalign.judge.compare import compare
from gradalign.runs.reader import read_run_dir

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
