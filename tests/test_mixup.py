"""Mixup drawn per micro-batch (its mixing weight and permutation) draws other numbers than the
baseline's one draw per batch: `dropout-rng`, whose message names such augmentations. Drawn once
per window over the window's B rows and sliced per micro-batch, it is the same training."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import gradalign
from gradalign.judge.compare import compare
from gradalign.runs.reader import read_run_dir

from .recorded_loop import classifier

BATCH, K, UPDATES = 16, 4, 3


def mixed(x: torch.Tensor, y: torch.Tensor, model: nn.Module) -> torch.Tensor:
    """Mixup's loss over rows `x`, `y`: a Beta(0.4, 0.4) weight and a permutation drawn now."""
    weight = float(torch.distributions.Beta(0.4, 0.4).sample())
    order = torch.randperm(len(y))
    logits = model(weight * x + (1 - weight) * x[order])
    ce = nn.functional.cross_entropy
    return weight * ce(logits, y, reduction="none") + (1 - weight) * ce(
        logits, y[order], reduction="none"
    )


def loop(out, k: int, per_window: bool) -> None:
    model, x, y = classifier(BATCH * UPDATES)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    torch.manual_seed(1)
    n = BATCH // k
    with gradalign.Recorder(out, model, opt, accum_steps=k) as rec:
        for u in range(UPDATES):
            rows = slice(u * BATCH, (u + 1) * BATCH)
            if per_window:  # the window's B rows mixed once, then sliced
                weight = float(torch.distributions.Beta(0.4, 0.4).sample())
                order = torch.randperm(BATCH)
                xs = weight * x[rows] + (1 - weight) * x[rows][order]
                pairs = (y[rows], y[rows][order])
            for j in range(k):
                part = slice(j * n, (j + 1) * n)
                xb, yb = x[rows][part], y[rows][part]
                if per_window:
                    logits = model(xs[part])
                    ce = nn.functional.cross_entropy
                    loss = weight * ce(logits, pairs[0][part]) + (1 - weight) * ce(
                        logits, pairs[1][part]
                    )
                else:
                    loss = mixed(xb, yb, model).mean()
                (loss / k).backward()
                rec.micro(loss.detach(), batch=(xb, yb))
            opt.step()
            opt.zero_grad()
            rec.update()


@pytest.mark.parametrize("per_window", [False, True])
def test_mixup_per_micro_batch_is_named_and_per_window_passes(tmp_path, per_window):
    loop(tmp_path / "base", 1, per_window)
    loop(tmp_path / "merged", K, per_window)
    c = compare(read_run_dir(tmp_path / "base"), read_run_dir(tmp_path / "merged"))
    if per_window:
        assert c.verdict == "pass", [(d.code, d.message[:200]) for d in c.diagnosis]
    else:
        first = c.diagnosis[0]
        assert first.code == "dropout-rng", [(d.code, d.message[:200]) for d in c.diagnosis]
        assert "mixup" in first.message
