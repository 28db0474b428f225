"""A loop that adds its own buffers of torch.autograd.grad and sets `.grad` once per window,
leaving the last micro-batch's gradient out: the Recorder counts no missing write to `.grad`
(there is one per window in both runs), so `micro-batch-missing` cannot be claimed; the gradient
at update 0 is near (K−1)/K of the baseline's, turned, and `cross-sample-loss` names a micro-
batch's gradient left out first among the causes that leave that trace."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import gradalign
from gradalign.judge.compare import compare
from gradalign.runs.reader import read_run_dir

from .recorded_loop import classifier

BATCH, K, UPDATES = 32, 4, 4


def loop(out, k: int, leave_out_last: bool = False):
    model, x, y = classifier(UPDATES * BATCH)
    params = list(model.parameters())
    opt = torch.optim.SGD(params, lr=0.1)
    n = BATCH // k
    with gradalign.Recorder(out, model, opt, accum_steps=k) as rec:
        for u in range(UPDATES):
            buffers = [torch.zeros_like(p) for p in params]
            for j in range(k):
                rows = slice(u * BATCH + j * n, u * BATCH + (j + 1) * n)
                loss = nn.functional.cross_entropy(model(x[rows]), y[rows])
                grads = torch.autograd.grad(loss / k, params)
                if not (leave_out_last and j == k - 1):
                    for buffer, grad in zip(buffers, grads, strict=True):
                        buffer += grad
                rec.micro(loss.detach(), batch=(x[rows], y[rows]))
            for p, buffer in zip(params, buffers, strict=True):
                p.grad = buffer
            opt.step()
            opt.zero_grad()
            rec.update()
    return read_run_dir(out)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("left_out")
    return {
        "base": loop(root / "base", 1),
        "merged": loop(root / "merged", K),
        "bug": loop(root / "bug", K, leave_out_last=True),
    }


def test_own_buffers_set_once_per_window_pass(runs):
    assert compare(runs["base"], runs["merged"]).verdict == "pass"


def test_a_micro_batch_left_out_of_own_buffers_is_named_first_among_the_causes(runs):
    c = compare(runs["base"], runs["bug"])
    first = c.diagnosis[0]
    assert first.code == "cross-sample-loss", [(d.code, d.message) for d in c.diagnosis]
    causes = first.message.split("do not add up to the gradient of B: ", 1)[1]
    assert causes.startswith("1 of the K=4 micro-batches' gradients left out"), causes[:200]
