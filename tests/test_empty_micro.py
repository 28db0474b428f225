"""A micro-batch of padding only (packed or bucketed token data): zero real tokens, whose mean is
NaN (a mean over none). Recorded with `items=0`, it weighs nothing in the window's loss: a loop
that normalizes by the window's tokens passes; one that divides each micro-batch's mean by K is
named by its reweighting."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

import gradalign
from gradalign.api import compare

UPDATES, B, T, V, K = 3, 8, 6, 11, 4


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    x = torch.randint(1, V, (UPDATES * B, T), generator=g)
    lengths = torch.randint(2, T + 1, (UPDATES * B,), generator=g)
    lengths[6:8] = 0  # update 0's last micro-batch (of K=4): padding only
    x[torch.arange(T)[None] >= lengths[:, None]] = 0
    y = torch.roll(x, -1, 1)
    y[:, -1] = 0
    y[y == 0] = -100
    return x, y


def record(out, k: int, float64: bool = False, bug: bool = False, reference=None) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(V, 12), nn.Tanh(), nn.Linear(12, V))
    model = model.double() if float64 else model
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    x, y = _data()
    n = B // k
    with gradalign.Recorder(out, model, opt, accum_steps=k, reference=reference) as rec:
        for update in range(UPDATES):
            window = (y[update * B : (update + 1) * B] != -100).sum()
            for micro in range(k):
                rows = slice(update * B + micro * n, update * B + (micro + 1) * n)
                tokens = int((y[rows] != -100).sum())
                total = F.cross_entropy(
                    model(x[rows]).reshape(-1, V), y[rows].reshape(-1), reduction="sum"
                )
                mean = total / tokens if tokens else total * float("nan")
                (mean / k if bug else total / window).backward()
                rec.micro(mean.detach(), items=tokens, batch=(x[rows], y[rows]))
            opt.step()
            rec.update()
            opt.zero_grad()


def test_a_micro_batch_of_no_tokens_weighs_nothing(tmp_path):
    """Its NaN mean failed `finite losses` and made the window's loss NaN ("nan times")."""
    record(tmp_path / "fp64", 1, float64=True)
    record(tmp_path / "base", 1, reference="../fp64")
    record(tmp_path / "merged", K)
    clean = compare(tmp_path / "base", tmp_path / "merged")
    assert clean.verdict == "pass", [c for c in clean.checks if c.status == "fail"]
    assert clean.merged.micro_items[K - 1] == 0  # the empty one was recorded as such
    record(tmp_path / "bug", K, bug=True)
    bug = compare(tmp_path / "base", tmp_path / "bug")
    assert bug.verdict == "fail" and bug.diagnosis[0].code == "token-normalization"
