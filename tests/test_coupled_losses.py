"""A loss that couples the samples of its batch (in-batch InfoNCE: each sample's negatives are
the others of its forward), accumulated by a correct loop: every micro-batch's loss is another
one than its share of the batch's, from update 0 on. It is `cross-sample-loss`; it was named
`zero-grad-in-window` first ("only the last micro-batch's gradient survived ... cleared by
hand"), a bug the loop does not have: its gradient is 0.46x the baseline's, which the shape of
a cleared window also fits, but clearing gradients changes no forward, and here update 0's
window loss differs (0.29 against 0.87) from the same weights over the same samples."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

import gradalign
from gradalign import api

B, UPDATES = 32, 4


def _infonce(z1: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
    z1, z2 = F.normalize(z1, dim=-1), F.normalize(z2, dim=-1)
    return F.cross_entropy(z1 @ z2.T / 0.2, torch.arange(len(z1)))


def _record(out, k: int, float64: bool = False, reference: str | None = None) -> None:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(B * UPDATES, 20, generator=g)
    views = (x, x + 0.1 * torch.randn(B * UPDATES, 20, generator=g))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(20, 32), nn.Tanh(), nn.Linear(32, 16))
    if float64:
        model, views = model.double(), tuple(v.double() for v in views)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    n = B // k
    with gradalign.Recorder(out, model, opt, accum_steps=k, reference=reference) as rec:
        for u in range(UPDATES):
            for j in range(k):
                rows = slice(u * B + j * n, u * B + (j + 1) * n)
                a, b = views[0][rows], views[1][rows]
                loss = _infonce(model(a), model(b))
                (loss / k).backward()
                rec.micro(loss.detach(), batch=(a, b))
            opt.step()
            rec.update()
            opt.zero_grad()


def test_an_in_batch_contrastive_loss_is_cross_sample_not_a_cleared_window(tmp_path):
    _record(tmp_path / "ref", 1, float64=True)
    _record(tmp_path / "base", 1, reference="../ref")
    _record(tmp_path / "merged", 4)
    c = api.compare(tmp_path / "base", tmp_path / "merged")
    codes = [d.code for d in c.diagnosis if d.severity == "error"]
    assert c.verdict == "fail" and codes[:1] == ["cross-sample-loss"], c.diagnosis
    assert "zero-grad-in-window" not in codes
