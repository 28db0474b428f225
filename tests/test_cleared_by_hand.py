"""Gradients cleared by hand inside the window (`p.grad = None` before each micro-batch): the
Recorder sees every gradient gone between two micro-steps (`update/discarded_micro_steps`), and
the judge names `zero-grad-in-window` from that count where the gradient's shape alone does not
fit a clear (judge/signatures/zero_grad.py `cleared_by_hand`)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import gradalign
from gradalign.api import compare
from gradalign.runs.reader import read_run_dir

UPDATES, BATCH, FEATURES = 10, 32, 10


def record(out, k: int, bug: str | None = None, float64: bool = False):
    """A Tanh MLP regressing x0·x1 under Adam: one micro-batch's gradient of this noisy
    regression lies far from the batch's, so what a clear leaves is no 1/K of it."""
    dtype = torch.float64 if float64 else torch.float32
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(FEATURES, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 1)
    ).to(dtype)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(BATCH * UPDATES, FEATURES, generator=g)
    y = (x[:, :1] * x[:, 1:2]).to(dtype)
    x = x.to(dtype)
    n = BATCH // k
    with gradalign.Recorder(out, model, opt, accum_steps=k) as rec:
        for u in range(UPDATES):
            for j in range(k):
                part = slice((u * k + j) * n, (u * k + j + 1) * n)
                if bug == "grad-none-per-micro":
                    for p in model.parameters():
                        p.grad = None
                elif bug == "sum-assigned-anew":  # a new tensor holding the sum so far: no clear
                    grads = [p.grad for p in model.parameters()]
                    for p in model.parameters():
                        p.grad = None
                loss = nn.functional.mse_loss(model(x[part]), y[part])
                (loss / k).backward()
                if bug == "sum-assigned-anew" and j:
                    for p, before in zip(model.parameters(), grads, strict=True):
                        p.grad = p.grad + before
                rec.micro(loss.detach(), batch=(x[part], y[part]))
            opt.step()
            rec.update()
            opt.zero_grad()
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("cleared")
    return {
        "base": record(root / "base", 1),
        "ref": record(root / "ref", 1, float64=True),
        **{bug: record(root / bug, 4, bug) for bug in ("grad-none-per-micro", "sum-assigned-anew")},
    }


def test_a_clear_by_hand_the_recorder_saw_is_named_where_the_shape_does_not_fit(runs):
    """The last micro-batch's gradient is 0.506 times the baseline's along it (cosine 0.60):
    over the 1/√K that `zero_grad_in_window`'s shape allows, and it was named
    `cross-sample-loss` ("2 of the K micro-batches' gradients left out")."""
    c = compare(runs["base"], runs["grad-none-per-micro"], reference=runs["ref"])
    found = c.diagnosis[0]
    assert c.verdict == "fail" and found.code == "zero-grad-in-window", [
        (d.code, d.message) for d in c.diagnosis
    ]
    assert found.evidence["micro_steps_cleared"] == 3
    assert found.evidence["windows_cleared"] == UPDATES
    assert found.evidence["grad_ratio"] > 0.5  # what the shape alone refuses
    assert "cleared by hand" in found.message and "p.grad = None" in found.fix


def test_a_sum_assigned_anew_reads_as_a_clear_yet_trains_alike(runs):
    """`p.grad = p.grad + g` replaces every gradient by another tensor, as a clear does: the
    Recorder counts it so, and the run passes (a diagnosis reads the count at failing updates
    only, and the gradient is the whole window's)."""
    run = read_run_dir(runs["sum-assigned-anew"])
    assert run.cleared_inside is not None and run.cleared_inside.tolist() == [3] * UPDATES
    c = compare(runs["base"], runs["sum-assigned-anew"], reference=runs["ref"])
    assert c.verdict == "pass", [(d.code, d.message) for d in c.diagnosis]
