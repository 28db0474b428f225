"""A gradient that fails at update 0, from the same weights, is no learning rate's doing: where
the only causes named are settings of the step (`lr-scaled`, `lr-schedule`, the optimizer's),
the update-0 gradient is read by the last resort first (judge/diagnose.py). A running total
backpropagated at every micro-step (`retain_graph=True`: micro-batch j counted K−j times) moved
the losses, which ReduceLROnPlateau (factor 0.5 = 1/√K at K=4) followed from update 8: it was
named `lr-scaled` alone, "a batch-size scaling rule applied when the run was resumed"."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import gradalign
from gradalign.api import compare

UPDATES, BATCH, K = 14, 32, 4


def record(out, k: int, bug: str | None = None, float64: bool = False):
    """K forwards summed into one backward per window, the plateau stepped on the window's mean."""
    dtype = torch.float64 if float64 else torch.float32
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 32), nn.Tanh(), nn.Linear(32, 3)).to(dtype)
    opt = torch.optim.SGD(model.parameters(), lr=0.8)
    plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, factor=0.5, patience=0, threshold=0)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(BATCH * UPDATES, 10, generator=g).to(dtype)
    y = (x[:, :3] - x[:, 3:6]).argmax(1)
    n = BATCH // k
    with gradalign.Recorder(out, model, opt, accum_steps=k) as rec:
        for u in range(UPDATES):
            total, losses = 0, []
            for j in range(k):
                part = slice((u * k + j) * n, (u * k + j + 1) * n)
                loss = nn.functional.cross_entropy(model(x[part]), y[part])
                total = total + loss / k
                losses.append(float(loss))
                if bug == "running-total":
                    total.backward(retain_graph=True)
                rec.micro(loss.detach(), batch=(x[part], y[part]))
            if bug != "running-total":
                total.backward()
            opt.step()
            rec.update()
            opt.zero_grad()
            plateau.step(losses[-1] if bug == "plateau-on-last" else sum(losses) / k)
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("plateau")
    return {
        "base": record(root / "base", 1),
        "ref": record(root / "ref", 1, float64=True),
        **{name: record(root / name, K, bug) for name, bug in [("clean", None),
            ("running-total", "running-total"), ("plateau-on-last", "plateau-on-last")]},
    }  # fmt: skip


def test_the_gradient_that_failed_first_is_named_before_the_lr_that_followed_it(runs):
    c = compare(runs["base"], runs["running-total"], reference=runs["ref"])
    codes = [d.code for d in c.diagnosis]
    assert codes == ["cross-sample-loss", "lr-scaled"], [(d.code, d.message) for d in c.diagnosis]
    assert "retain_graph=True" in c.diagnosis[0].message
    scaled = c.diagnosis[1]
    assert scaled.evidence["first_update"] > 0 and "ReduceLROnPlateau" in scaled.message


def test_a_plateau_fed_another_loss_is_still_the_schedule(runs):
    assert compare(runs["base"], runs["clean"], reference=runs["ref"]).verdict == "pass"
    c = compare(runs["base"], runs["plateau-on-last"], reference=runs["ref"])
    assert [d.code for d in c.diagnosis][:1] == ["lr-schedule"], [
        (d.code, d.message) for d in c.diagnosis
    ]
