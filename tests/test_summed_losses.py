"""A loss summed over the samples (reduction="sum") divided by the batch size trains as the
batch's mean; recorded plainly, the baseline's loss is a sum over the batch and each micro-batch's
a sum over its share, so the window's mean of them is 1/K of the baseline's while the weights and
gradients agree. `loss-averaging` names both readings of that ratio (a loss recorded divided by
K, or a sum averaged as a mean) and says how to record a sum; recorded with `loss_sum=` and
`items=`, the same runs pass."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import gradalign
from gradalign.judge.compare import compare
from gradalign.runs.reader import read_run_dir

from .recorded_loop import classifier

BATCH, K, UPDATES = 32, 4, 4


def loop(out, k: int, as_sum: bool) -> None:
    model, x, y = classifier(UPDATES * BATCH)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    n = BATCH // k
    with gradalign.Recorder(out, model, opt, accum_steps=k) as rec:
        for u in range(UPDATES):
            for j in range(k):
                rows = slice(u * BATCH + j * n, u * BATCH + (j + 1) * n)
                total = nn.functional.cross_entropy(model(x[rows]), y[rows], reduction="sum")
                (total / BATCH).backward()
                if as_sum:
                    rec.micro(loss_sum=total.detach(), items=n, batch=(x[rows], y[rows]))
                else:
                    rec.micro(total.detach(), batch=(x[rows], y[rows]))
            opt.step()
            rec.update()
            opt.zero_grad()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("summed")
    for as_sum in (False, True):
        for name, k in (("base", 1), ("merged", K)):
            loop(root / f"{name}-{as_sum}", k, as_sum)
    return lambda as_sum: [read_run_dir(root / f"{n}-{as_sum}") for n in ("base", "merged")]


def test_sums_recorded_as_sums_pass(runs):
    c = compare(*runs(True))
    assert c.verdict == "pass", [(d.code, d.message) for d in c.diagnosis]


def test_sums_recorded_plainly_are_named_with_how_to_record_a_sum(runs):
    c = compare(*runs(False))
    assert c.verdict == "fail"
    status = {check.name: check.status for check in c.checks}
    assert status["losses"] == "fail" and status["weights"] == "pass", status
    first = c.diagnosis[0]
    assert first.code == "loss-averaging", [(d.code, d.message) for d in c.diagnosis]
    assert abs(first.evidence["window_loss_ratio"] * K - 1) < 1e-3
    assert 'reduction="sum"' in first.message
    assert "loss_sum=" in first.fix
