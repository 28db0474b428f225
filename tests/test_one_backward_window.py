"""A loop that forwards the window's K micro-batches and backpropagates their losses once, the
Recorder's micro() after that backward: the gradient does not change between its micro-steps,
as where a micro-batch is never backpropagated. Its losses not divided by K make the gradient K
times the baseline's, in its direction: `loss-scale`, not `micro-batch-missing` (which named it
"3 of its 4 micro-batches"); a micro-batch truly left out still is."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import gradalign
from gradalign.judge.compare import compare
from gradalign.runs.reader import read_run_dir

from .recorded_loop import classifier

BATCH, K, UPDATES = 32, 4, 3


def loop(out, k: int, divide: bool = True, backward_each: bool = False):
    """One backward of the window's losses (divided by K, or not), micro() after it; or
    (`backward_each`) a backward per micro-batch but the last one's, micro() after each."""
    model, x, y = classifier(UPDATES * BATCH)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    n = BATCH // k
    with gradalign.Recorder(out, model, opt, accum_steps=k) as rec:
        for u in range(UPDATES):
            losses, batches = [], []
            for j in range(k):
                rows = slice(u * BATCH + j * n, u * BATCH + (j + 1) * n)
                loss = nn.functional.cross_entropy(model(x[rows]), y[rows])
                if backward_each and j < k - 1:
                    (loss / k).backward()
                losses.append(loss)
                batches.append((x[rows], y[rows]))
            if not backward_each:
                (sum(losses) / (k if divide else 1)).backward()
            for loss, batch in zip(losses, batches, strict=True):
                rec.micro(loss.detach(), batch=batch)
            opt.step()
            opt.zero_grad()
            rec.update()
    return read_run_dir(out)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("one_backward")
    return {
        "base": loop(root / "base", 1),
        "merged": loop(root / "merged", K),
        "undivided": loop(root / "undivided", K, divide=False),
        "left-out": loop(root / "left-out", K, backward_each=True),
    }


def test_one_backward_per_window_passes(runs):
    assert compare(runs["base"], runs["merged"]).verdict == "pass"


def test_its_losses_not_divided_by_k_are_a_loss_scale(runs):
    c = compare(runs["base"], runs["undivided"])
    first = c.diagnosis[0]
    assert first.code == "loss-scale", [(d.code, d.message) for d in c.diagnosis]
    assert first.evidence["expected_ratio"] == K


def test_a_micro_batch_never_backpropagated_is_still_missing(runs):
    c = compare(runs["base"], runs["left-out"])
    assert c.diagnosis[0].code == "micro-batch-missing", [(d.code, d.message) for d in c.diagnosis]
